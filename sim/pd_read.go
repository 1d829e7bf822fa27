package sim

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"sync"
	"time"
)

// The decode side of a KV transfer: reading a prefill engine's held blocks
// over the side channel (NIXL) or the bootstrap connection (SGLang).

// nixlRead is the decode side of vLLM's NIXL protocol: it reads the blocks
// the local cache lacks from the prefill engine named by kp and returns how
// many leading prompt tokens now have KV (0 = prefill locally).
func (p *pdState) nixlRead(ctx context.Context, rk *rank, g *gen, kp *kvTransferParams) int {
	lbl := []string{p.s.cfg.Model, strconv.Itoa(rk.idx)}
	if len(kp.RemoteBlockIDs) == 0 || kp.RemoteEngineID == nil || kp.RemoteRequestID == nil || kp.RemoteHost == nil || kp.RemotePort == nil {
		p.log.Warn("Got invalid KVTransferParams. This request will not utilize KVTransfer", "request_id", g.id, "params", kp.String())
		p.metrics.invalid.WithLabelValues(lbl...).Inc()
		return 0
	}
	prompt := g.prompts[0]
	bs := p.s.cfg.Engine.BlockSize
	rk.mu.Lock()
	hit := rk.eng.PrefixHitBlocks(prompt, "", g.salt)
	rk.mu.Unlock()
	ids := kp.RemoteBlockIDs[min(hit, len(kp.RemoteBlockIDs)):]
	msg := readMsg{EngineID: *kp.RemoteEngineID, RequestID: *kp.RemoteRequestID, BlockIDs: make([]uint32, 0, len(ids))}
	for _, id := range ids {
		if id < 0 || id > 1<<31 {
			p.log.Warn("Got invalid KVTransferParams: block id out of range", "request_id", g.id, "block_id", id)
			p.metrics.invalid.WithLabelValues(lbl...).Inc()
			return 0
		}
		msg.BlockIDs = append(msg.BlockIDs, uint32(id))
	}
	addr := net.JoinHostPort(bareHost(*kp.RemoteHost), strconv.Itoa(*kp.RemotePort))
	start := hit * bs
	got, d, err := p.transfer(ctx, rk, addr, frameRead, msg.appendBody(nil), prompt, start, len(ids))
	if err != nil {
		if ctx.Err() != nil || errors.Is(err, ErrClosed) {
			return 0 // the client left or the server closes: nothing failed on the wire
		}
		p.log.Warn("KV transfer failed; prefilling locally", "request_id", g.id, "remote", addr, "err", err)
		p.metrics.failed.WithLabelValues(lbl...).Inc()
		return 0
	}
	p.observe(lbl, len(ids), d)
	return start + got
}

// bootstrapRead is the decode side of SGLang's protocol: wait for the
// room's KV on the prefill's bootstrap server and read all of it.
func (p *pdState) bootstrapRead(ctx context.Context, rk *rank, g *gen, pr *pdRequest) (int, error) {
	if pr.BootstrapHost == nil || *pr.BootstrapHost == "" {
		return 0, errors.New("bootstrap_host missing")
	}
	port := 8998
	if pr.BootstrapPort != nil {
		port = *pr.BootstrapPort
	}
	prompt := g.prompts[0]
	bs := p.s.cfg.Engine.BlockSize
	nb := (len(prompt) + bs - 1) / bs
	msg := waitMsg{Room: *pr.BootstrapRoom, TimeoutMS: uint64(p.cfg.BootstrapTimeout / time.Millisecond)}
	addr := net.JoinHostPort(bareHost(*pr.BootstrapHost), strconv.Itoa(port))
	got, d, err := p.transfer(ctx, rk, addr, frameWait, msg.appendBody(nil), prompt, 0, nb)
	if err != nil {
		return 0, err
	}
	p.observe([]string{p.s.cfg.Model, strconv.Itoa(rk.idx)}, nb, d)
	return got, nil
}

// bareHost is a remote_host or bootstrap_host without the brackets an
// IPv6 address may come in ("[::1]", as VLLM_NIXL_SIDE_CHANNEL_HOST may
// give it: vLLM's make_zmq_path brackets only an unbracketed IPv6 address,
// so both forms reach its side channel), for net.JoinHostPort, which would
// bracket it again ([[::1]]:5600).
func bareHost(h string) string {
	if len(h) > 2 && h[0] == '[' && h[len(h)-1] == ']' {
		return h[1 : len(h)-1]
	}
	return h
}

func (p *pdState) observe(lbl []string, blocks int, d time.Duration) {
	m := p.metrics
	m.xferTime.WithLabelValues(lbl...).Observe(d.Seconds())
	m.bytes.WithLabelValues(lbl...).Observe(p.s.cfg.Engine.Profile.BlockBytes(p.s.cfg.Engine.BlockSize) * float64(blocks))
	m.descriptors.WithLabelValues(lbl...).Observe(float64(blocks * 2 * max(1, p.s.cfg.Engine.Profile.Layers)))
	m.transfers.WithLabelValues("recv").Inc()
}

// transfer runs one side-channel conversation as the reader: send the
// request frame, receive the blocks' tokens (checked against prompt from
// start), wait the modelled transfer time of blocks blocks, then hand the
// connection to ack (DONE, and the prefill's ACK off the request path). It
// returns the number of prompt tokens received and the modelled transfer
// time.
func (p *pdState) transfer(ctx context.Context, rk *rank, addr string, t frameType, body []byte, prompt []uint32, start, blocks int) (int, time.Duration, error) {
	p.metrics.inflight.Add(1)
	rk.transferring.Add(1)
	defer func() { p.metrics.inflight.Add(-1); rk.transferring.Add(-1) }()
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second) // vLLM's handshake timeout
	conn, err := (&net.Dialer{}).DialContext(dctx, "tcp", addr)
	cancel()
	if err != nil {
		return 0, 0, fmt.Errorf("dial side channel: %w", err)
	}
	handed := false // to ack, which closes it
	defer func() {
		if !handed {
			_ = conn.Close()
		}
	}()
	replyWait := 30 * time.Second
	if t == frameWait {
		replyWait += p.cfg.BootstrapTimeout
	}
	_ = conn.SetDeadline(time.Now().Add(replyWait))
	// Until the read is posted the request's end cuts the wait (a deadline
	// in the past wakes it); after, the transfer runs out (below). The hook
	// is registered after the reply deadline is set: a deadline, unlike a
	// close, can be overwritten, and a cancel that came first must stick.
	var mu sync.Mutex
	posted := false
	stop := context.AfterFunc(ctx, func() {
		mu.Lock()
		defer mu.Unlock()
		if !posted {
			_ = conn.SetDeadline(time.Unix(1, 0))
		}
		if p.onCut != nil {
			p.onCut()
		}
	})
	defer stop()
	if p.onArmed != nil {
		p.onArmed()
	}
	if _, err := conn.Write(appendFrame(nil, t, body)); err != nil {
		return 0, 0, fmt.Errorf("send %v: %w", t, err)
	}
	br := bufio.NewReader(conn)
	bm, err := readBlocksReply(br)
	if err != nil {
		return 0, 0, err
	}
	bs := p.s.cfg.Engine.BlockSize
	if bm.BlockSize != bs {
		return 0, 0, fmt.Errorf("remote block size %d, local %d", bm.BlockSize, bs)
	}
	want := prompt[min(start, len(prompt)):min(start+len(bm.Tokens), len(prompt))]
	if !slices.Equal(bm.Tokens[:len(want)], want) {
		return 0, 0, errors.New("the remote blocks hold other tokens than this prompt")
	}
	d := p.s.cfg.Engine.Profile.KVTransferTime(blocks, bs, p.cfg.TransferGbps)
	// The read is posted now. In vLLM the NIXL READ carries a notification
	// that reaches the prefill engine when the transfer completes, even when
	// the decode request is aborted meanwhile (the decode engine keeps the
	// destination blocks until then), and the prefill engine frees its
	// blocks on it, not at its abort timeout. So the request's end no longer
	// cuts the exchange: the modelled transfer runs out and DONE is sent
	// (only the server's close stops it), and a cancelled request fails
	// after that.
	mu.Lock()
	posted = true
	mu.Unlock()
	p.posted.Add(1)
	defer p.posted.Add(-1)
	if err := p.sleepModelled(context.WithoutCancel(ctx), d); err != nil {
		return 0, 0, err
	}
	handed = true
	p.ack(conn, br, rk, addr)
	if err := ctx.Err(); err != nil {
		return 0, 0, err // the request ended during the transfer
	}
	return len(want), d, nil
}

// ackWait bounds the wait for the prefill engine's ACK to DONE.
const ackWait = 30 * time.Second

// ack sends DONE on a read's connection (the prefill engine frees the
// blocks on it) and waits up to ackWait for the ACK, on a goroutine of p's
// own, then closes the connection. The KV has arrived by then: vLLM's NIXL
// completion notification is fire-and-forget for the decode side, so the
// request goes on at once. The wait used to be on the request path: a
// prefill engine that hung after handing over its blocks held the decode
// request 30 s. A missing ACK (no answer in time, a closed connection, a
// wrong frame) is counted in kvmesh_sim_pd_ack_missing_total; Close cuts
// the waits.
func (p *pdState) ack(conn net.Conn, br *bufio.Reader, rk *rank, addr string) {
	p.mu.Lock()
	select {
	case <-p.quit:
		p.mu.Unlock()
		_ = conn.Close()
		return
	default:
	}
	p.readers[conn] = struct{}{}
	p.wg.Add(1) // under mu: close takes mu after closing quit, before it waits
	p.mu.Unlock()
	go func() {
		defer p.wg.Done()
		_ = conn.SetDeadline(time.Now().Add(ackWait))
		var typ frameType
		var rb []byte
		_, err := conn.Write(appendFrame(nil, frameDone, nil))
		if err == nil {
			typ, rb, err = readFrame(br, nil)
		}
		p.mu.Lock()
		delete(p.readers, conn)
		p.mu.Unlock()
		_ = conn.Close()
		if err == nil && typ == frameAck && decodeEmpty(rb) == nil {
			return
		}
		select {
		case <-p.quit:
			return // cut by Close
		default:
		}
		p.metrics.ackMissing.WithLabelValues(p.s.cfg.Model, strconv.Itoa(rk.idx)).Inc()
		p.log.Debug("no ACK after DONE; the KV had arrived", "remote", addr, "frame", typ, "err", err)
	}()
}

// readBlocksReply reads the prefill's answer to READ or WAIT: the blocks'
// tokens, or its ERROR as a *remoteError.
func readBlocksReply(br *bufio.Reader) (blocksMsg, error) {
	typ, rb, err := readFrame(br, nil)
	if err != nil {
		return blocksMsg{}, fmt.Errorf("read reply: %w", err)
	}
	switch typ {
	case frameBlocks:
		return decodeBlocksMsg(rb)
	case frameError:
		em, err := decodeErrorMsg(rb)
		if err != nil {
			return blocksMsg{}, err
		}
		return blocksMsg{}, &remoteError{em}
	}
	return blocksMsg{}, protoErr("unexpected %v reply", typ)
}

// sleepModelled waits modelled duration d in scaled wall time (the
// transfer), or until the request or the server ends.
func (p *pdState) sleepModelled(ctx context.Context, d time.Duration) error {
	wait := p.s.cfg.wallFor(d)
	if wait <= 0 {
		return nil
	}
	timer := time.NewTimer(wait)
	defer timer.Stop()
	select {
	case <-timer.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-p.quit:
		return ErrClosed
	}
}
