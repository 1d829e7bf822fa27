package sim

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"slices"
	"time"
)

// The prefill side of a KV transfer: the side-channel (NIXL, one listener
// per rank) and bootstrap (SGLang) servers answering reads of held blocks.

// accept serves side-channel (rk set) or bootstrap (rk nil) connections.
func (p *pdState) accept(ln net.Listener, rk *rank) {
	for {
		conn, err := ln.Accept()
		if err != nil {
			select {
			case <-p.quit:
				return
			default:
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			p.log.Error("side channel accept", "err", err)
			return
		}
		p.mu.Lock()
		if len(p.conns) >= maxSideConns {
			p.mu.Unlock()
			_ = conn.Close()
			p.metrics.protoErrors.Inc()
			continue
		}
		p.conns[conn] = struct{}{}
		p.mu.Unlock()
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			p.serveConn(conn, rk)
			p.mu.Lock()
			delete(p.conns, conn)
			p.mu.Unlock()
			_ = conn.Close()
		}()
	}
}

// maxSideConns bounds concurrent side-channel connections; beyond it new
// ones are closed at once (the reader falls back to a local prefill).
const maxSideConns = 1024

// firstFrameWait bounds the wait for a connection's first frame. A reader
// sends READ (or WAIT) as soon as it is connected, so a connection silent
// for this long holds one of the maxSideConns slots for nothing: idle or
// half-open ones, reopened as they close, would otherwise keep every real
// transfer out (each used to hold its slot for the 30 s exchange deadline).
const firstFrameWait = 5 * time.Second

// serveConn answers one read: READ (NIXL) or WAIT (SGLang), then DONE.
func (p *pdState) serveConn(conn net.Conn, rk *rank) {
	wait := firstFrameWait
	if d := time.Duration(p.firstFrame.Load()); d > 0 {
		wait = d
	}
	_ = conn.SetDeadline(time.Now().Add(wait))
	br := bufio.NewReader(conn)
	typ, body, err := readFrame(br, nil)
	if err != nil {
		if errors.Is(err, ErrSideChannel) {
			p.metrics.protoErrors.Inc()
			p.reply(conn, frameError, (&errorMsg{xferErrProtocol, err.Error()}).appendBody(nil))
		}
		return
	}
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // the exchange's reply
	var h *hold
	var em *errorMsg
	switch {
	case typ == frameRead && rk != nil:
		h, em = p.lookupRead(rk, body)
	case typ == frameWait && rk == nil:
		h, em = p.lookupRoom(conn, body)
	default:
		em = &errorMsg{xferErrProtocol, fmt.Sprintf("unexpected %v frame", typ)}
	}
	if em != nil {
		if em.Code == xferErrProtocol {
			p.metrics.protoErrors.Inc()
		}
		p.reply(conn, frameError, em.appendBody(nil))
		return
	}
	bm := blocksMsg{BlockSize: p.s.cfg.Engine.BlockSize, Tokens: h.tokens}
	if typ == frameRead {
		bm.Tokens = p.readTokens(h, body)
	}
	if !p.reply(conn, frameBlocks, bm.appendBody(nil)) {
		return
	}
	// The reader now waits the modelled transfer time; the hold keeps the
	// blocks until DONE or until it expires.
	_ = conn.SetDeadline(time.Now().Add(p.cfg.AbortTimeout + 30*time.Second))
	typ, body, err = readFrame(br, body)
	if err != nil || typ != frameDone || decodeEmpty(body) != nil {
		if errors.Is(err, ErrSideChannel) || (err == nil && typ != frameDone) {
			p.metrics.protoErrors.Inc()
		}
		return
	}
	if got := p.take(h.key); got != nil {
		// Counted before the blocks are freed: whoever sees them freed
		// sees the transfer counted (TestPDNixlDecodeReadsBlocksAndPrefillFreesThem
		// scraped in between on a loaded machine).
		p.metrics.transfers.WithLabelValues("send").Inc()
		p.releaseHold(got)
	}
	if p.onDone != nil && !p.onDone() {
		return
	}
	p.reply(conn, frameAck, nil)
}

func (p *pdState) reply(conn net.Conn, t frameType, body []byte) bool {
	_, err := conn.Write(appendFrame(nil, t, body))
	return err == nil
}

// lookupRead finds the hold a READ names on rank rk.
func (p *pdState) lookupRead(rk *rank, body []byte) (*hold, *errorMsg) {
	m, err := decodeReadMsg(body)
	if err != nil {
		return nil, &errorMsg{xferErrProtocol, err.Error()}
	}
	if want := p.cfg.engineID(rk.idx, len(p.s.ranks)); m.EngineID != want {
		return nil, &errorMsg{xferErrEngine, fmt.Sprintf("engine id %q is not this engine (%q)", m.EngineID, want)}
	}
	p.mu.Lock()
	h := p.holds["req:"+m.RequestID]
	p.mu.Unlock()
	if h == nil || h.rk != rk {
		return nil, &errorMsg{xferErrUnknown, fmt.Sprintf("no held blocks for request %q (never held, read already or expired)", m.RequestID)}
	}
	for _, id := range m.BlockIDs {
		if !slices.Contains(h.blocks, int32(id)) {
			return nil, &errorMsg{xferErrBlocks, fmt.Sprintf("block %d is not held by request %q", id, m.RequestID)}
		}
	}
	return h, nil
}

// readTokens returns the tokens of the blocks a READ asked for, in order.
func (p *pdState) readTokens(h *hold, body []byte) []uint32 {
	m, _ := decodeReadMsg(body) // decoded before
	bs := p.s.cfg.Engine.BlockSize
	var out []uint32
	for _, id := range m.BlockIDs {
		i := slices.Index(h.blocks, int32(id))
		out = append(out, h.tokens[min(i*bs, len(h.tokens)):min((i+1)*bs, len(h.tokens))]...)
	}
	return out
}

// lookupRoom waits for a bootstrap room's hold.
func (p *pdState) lookupRoom(conn net.Conn, body []byte) (*hold, *errorMsg) {
	m, err := decodeWaitMsg(body)
	if err != nil {
		return nil, &errorMsg{xferErrProtocol, err.Error()}
	}
	wait := p.cfg.BootstrapTimeout
	if m.TimeoutMS > 0 && time.Duration(m.TimeoutMS)*time.Millisecond < wait {
		wait = time.Duration(m.TimeoutMS) * time.Millisecond
	}
	p.mu.Lock()
	rm := p.rooms[m.Room]
	if rm == nil {
		rm = &room{ready: make(chan struct{}), created: time.Now()}
		p.rooms[m.Room] = rm
	}
	p.mu.Unlock()
	_ = conn.SetDeadline(time.Now().Add(wait + 30*time.Second))
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-rm.ready:
	case <-timer.C:
		return nil, &errorMsg{xferErrTimeout, fmt.Sprintf("bootstrap room %d: no prefill finished within %v", m.Room, wait)}
	case <-p.quit:
		return nil, &errorMsg{xferErrClosed, "prefill engine shutting down"}
	}
	p.mu.Lock()
	h := rm.h
	if h == nil || p.holds[h.key] != h {
		h = nil
	}
	p.mu.Unlock()
	if h == nil {
		return nil, &errorMsg{xferErrUnknown, fmt.Sprintf("bootstrap room %d: KV read already or expired", m.Room)}
	}
	return h, nil
}
