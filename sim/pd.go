package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// Prefill/decode disaggregation (docs/SIMULATOR.md, "Disaggregated
// prefill"). A prefill leg is an engine request with HoldBlocks: when it
// finishes its blocks stay referenced and a hold is registered here under a
// key ("req:<remote_request_id>" for vLLM's NIXL protocol, "room:<n>" for
// SGLang's bootstrap room). A decode engine reads the hold over the side
// channel (sidechannel.go), waits the modelled transfer time, sends DONE,
// and the prefill engine releases the blocks; a hold nobody reads is
// released after AbortTimeout. The decode then submits its request with
// ExternalTokens, so the transferred blocks enter its prefix cache
// (BlockStored) and only the last prompt token is computed.

// pdState is a server's P/D machinery. Lock order: rank.mu before pd.mu;
// pd.mu is never held while taking a rank's lock.
type pdState struct {
	s       *Server
	cfg     PDConfig
	log     *slog.Logger
	metrics *pdMetrics

	mu    sync.Mutex
	holds map[string]*hold // by key
	rooms map[uint64]*room // SGLang prefill: bootstrap rooms, by room id
	seq   uint64
	conns map[net.Conn]struct{}
	// readers are decode-side connections waiting for the prefill's ACK
	// (ack), closed by close.
	readers map[net.Conn]struct{}

	listeners []net.Listener // NIXL: one side channel per rank; SGLang prefill: the bootstrap listener
	sideAddrs []string       // NIXL: rank r's side-channel address (host from config, bound port)
	quit      chan struct{}
	wg        sync.WaitGroup
	// posted counts decode reads past the blocks' arrival, in their
	// modelled transfer (tests wait on it).
	posted atomic.Int64
	// onArmed and onCut, when set (tests only), run in a decode read once
	// the request's end can cut its wait for the reply, and in the hook
	// that cuts it.
	onArmed, onCut func()
	// onDone, when set (tests only), runs on the prefill side after DONE
	// freed the blocks, before the ACK; false withholds the ACK (the
	// connection is closed instead).
	onDone func() bool
	// firstFrame replaces firstFrameWait (tests only, set while serving:
	// ns; 0: firstFrameWait).
	firstFrame atomic.Int64
}

// hold is a finished prefill leg's blocks waiting to be read.
type hold struct {
	key     string
	rk      *rank
	eng     *engine.Engine // the engine holding them (a restart replaces it)
	req     *engine.Request
	blocks  []int32
	tokens  []uint32 // the tokens whose KV the blocks hold, in block order
	expires time.Time
	stale   bool // replaced by a newer hold under the same key: release without counting an expiry
}

// room is an SGLang bootstrap room: ready closes when its prefill's hold is
// registered (the decode may ask before the prefill arrives).
type room struct {
	ready   chan struct{}
	h       *hold
	created time.Time
}

// kvTransferParams is vLLM's kv_transfer_params map with the fields the
// NIXL connector reads; pointers tell missing from zero.
type kvTransferParams struct {
	DoRemoteDecode  *bool   `json:"do_remote_decode"`
	DoRemotePrefill *bool   `json:"do_remote_prefill"`
	RemoteBlockIDs  []int64 `json:"remote_block_ids"`
	RemoteEngineID  *string `json:"remote_engine_id"`
	RemoteRequestID *string `json:"remote_request_id"`
	RemoteHost      *string `json:"remote_host"`
	RemotePort      *int    `json:"remote_port"`
	TPSize          *int    `json:"tp_size"`
}

// pdRequest is the P/D part of a request body.
type pdRequest struct {
	KVTransferParams *kvTransferParams `json:"kv_transfer_params"`
	BootstrapHost    *string           `json:"bootstrap_host"`
	BootstrapPort    *int              `json:"bootstrap_port"`
	BootstrapRoom    *uint64           `json:"bootstrap_room"`
}

// decodePD extracts a body's P/D fields when P/D is on and the body names
// one (a byte search first: most bodies are not P/D legs, and a second full
// decode of a 100k-token prompt is not free).
func (s *Server) decodePD(body []byte) (*pdRequest, error) {
	if s.pd == nil || (!bytes.Contains(body, []byte(`"kv_transfer_params"`)) && !bytes.Contains(body, []byte(`"bootstrap_room"`))) {
		return nil, nil
	}
	return decodePDRequest(body)
}

// decodePDRequest extracts the P/D fields of a request body (the OpenAI
// decoders ignore them). Members are read by their exact names, as Python
// reads a dict: encoding/json's struct decoding would also take a
// case-variant "KV_Transfer_Params"; the last of repeated members wins, as
// in a dict. The top-level members are scanned in place (jsonscan) and
// only the P/D values decoded: no map of the body's members and no copy of
// each (the prompt's included) per request. Wrong types are a 400, like a
// bad field anywhere.
func decodePDRequest(body []byte) (*pdRequest, error) {
	var vals [len(pdMembers)][]byte // the last value of each, a span of body
	err := jsonscan.ForEachMember(body, func(key, val []byte, _, _ int) error {
		for i, name := range pdMembers {
			if string(key) == name {
				vals[i] = val
			}
		}
		return nil
	})
	if err != nil {
		// Not an object, or one the scanner does not take (nested deeper
		// than its limit, which encoding/json's decoders allow): read
		// as encoding/json reads it.
		return decodePDRequestMap(body)
	}
	return pdFromMembers(&vals)
}

// decodePDRequestMap is decodePDRequest through a map of every member
// (encoding/json's reading): the fallback for bodies the scanner refuses.
func decodePDRequestMap(body []byte) (*pdRequest, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, nil // not an object: reported by the OpenAI decoder
	}
	var vals [len(pdMembers)][]byte
	for i, name := range pdMembers {
		if v, ok := m[name]; ok {
			vals[i] = v
		}
	}
	return pdFromMembers(&vals)
}

// pdMembers are the P/D members' names, in pdRequest's field order.
var pdMembers = [...]string{"kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room"}

// pdFromMembers decodes the raw values of pdMembers (nil: absent); nil
// when the body names no P/D leg.
func pdFromMembers(vals *[len(pdMembers)][]byte) (*pdRequest, error) {
	for i, v := range vals {
		if string(v) == "null" {
			vals[i] = nil // as absent: decoding null leaves the field nil
		}
	}
	if vals[0] == nil && vals[1] == nil && vals[2] == nil && vals[3] == nil {
		return nil, nil // no allocation for a body without P/D members
	}
	p := new(pdRequest)
	for i, dst := range [...]any{&p.KVTransferParams, &p.BootstrapHost, &p.BootstrapPort, &p.BootstrapRoom} {
		if vals[i] == nil {
			continue
		}
		if err := json.Unmarshal(vals[i], dst); err != nil {
			var te *json.UnmarshalTypeError
			if !errors.As(err, &te) {
				return nil, nil
			}
			field := pdMembers[i]
			if te.Field != "" {
				field += "." + te.Field
			}
			return nil, badRequest("%s: %v", field, err)
		}
	}
	if p.KVTransferParams == nil && p.BootstrapRoom == nil && p.BootstrapHost == nil {
		return nil, nil
	}
	return p, nil
}

func isTrue(b *bool) bool { return b != nil && *b }

func newPDState(s *Server) (*pdState, error) {
	p := &pdState{s: s, cfg: s.cfg.PD, log: s.cfg.Logger.With("component", "sim-pd", "model", s.cfg.Model), holds: make(map[string]*hold),
		rooms: make(map[uint64]*room), conns: make(map[net.Conn]struct{}), readers: make(map[net.Conn]struct{}), quit: make(chan struct{})}
	p.metrics = newPDMetrics(s, p)
	switch {
	case p.cfg.KVTransfer != nil:
		for r := range s.ranks {
			addr := net.JoinHostPort(p.cfg.SideChannelHost, "0")
			if p.cfg.SideChannelPort != 0 {
				addr = net.JoinHostPort(p.cfg.SideChannelHost, strconv.Itoa(p.cfg.SideChannelPort+r))
			}
			ln, err := net.Listen("tcp", addr)
			if err != nil {
				p.closeListeners()
				return nil, fmt.Errorf("rank %d: nixl side channel: listen %s: %w", r, addr, err)
			}
			p.listeners = append(p.listeners, ln)
			port := ln.Addr().(*net.TCPAddr).Port
			p.sideAddrs = append(p.sideAddrs, net.JoinHostPort(p.cfg.SideChannelHost, strconv.Itoa(port)))
		}
	case p.cfg.DisaggregationMode == "prefill":
		ln, err := net.Listen("tcp", p.cfg.BootstrapAddr)
		if err != nil {
			return nil, fmt.Errorf("bootstrap server: listen %s: %w", p.cfg.BootstrapAddr, err)
		}
		p.listeners = append(p.listeners, ln)
	}
	return p, nil
}

// start runs the accept loops and the expiry sweeper.
func (p *pdState) start() {
	for i, ln := range p.listeners {
		var rk *rank
		if p.cfg.KVTransfer != nil {
			rk = p.s.ranks[i]
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.accept(ln, rk) }()
	}
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.sweep() }()
}

// close stops accepting, cuts open side-channel connections and waits.
func (p *pdState) close() {
	close(p.quit)
	p.closeListeners()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	for c := range p.readers {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *pdState) closeListeners() {
	for _, ln := range p.listeners {
		_ = ln.Close()
	}
}

// sweep releases holds nobody read within AbortTimeout, and forgets
// bootstrap rooms whose prefill never came.
func (p *pdState) sweep() {
	every := min(max(p.cfg.AbortTimeout/8, 5*time.Millisecond), time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-p.quit:
			return
		case now := <-t.C:
			p.sweepAt(now)
		}
	}
}

// sweepAt releases the holds expired at now (one sweeper tick; tests call
// it with a time of their own).
func (p *pdState) sweepAt(now time.Time) {
	for _, h := range p.expired(now) {
		if !h.stale {
			p.log.Warn("Releasing expired KV blocks: no decode engine read them in time",
				"request_id", h.key, "blocks", len(h.blocks), "timeout", p.cfg.AbortTimeout)
			p.metrics.expired.WithLabelValues(p.s.cfg.Model, strconv.Itoa(h.rk.idx)).Inc()
		}
		p.releaseHold(h)
	}
}

func (p *pdState) expired(now time.Time) []*hold {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []*hold
	for k, h := range p.holds {
		if now.After(h.expires) {
			delete(p.holds, k)
			out = append(out, h)
		}
	}
	for id, rm := range p.rooms {
		if rm.h == nil && now.Sub(rm.created) > p.cfg.BootstrapTimeout+p.cfg.AbortTimeout {
			delete(p.rooms, id)
		} else if rm.h != nil && p.holds[rm.h.key] != rm.h {
			delete(p.rooms, id) // read or expired
		}
	}
	return out
}

// take removes and returns the hold under key.
func (p *pdState) take(key string) *hold {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := p.holds[key]
	delete(p.holds, key)
	return h
}

// releaseHold frees h's blocks on its engine (unless a restart replaced it).
func (p *pdState) releaseHold(h *hold) {
	rk := h.rk
	rk.mu.Lock()
	if rk.eng == h.eng {
		rk.eng.ReleaseHeld(h.req)
	}
	rk.mu.Unlock()
	signal(rk.wake) // freed blocks may admit a waiting request
}

// onFinished registers a finished prefill leg's hold. Called by the rank's
// deliver (or abort, for a leg finished just before its client left) with
// rk.mu held.
func (p *pdState) onFinished(rk *rank, c *call) {
	r := c.req
	if !r.Holding() {
		return
	}
	h := &hold{key: c.pdKey, rk: rk, eng: rk.eng, req: r, blocks: r.BlockIDs(nil), expires: time.Now().Add(p.cfg.AbortTimeout)}
	bs := rk.eng.Config().BlockSize
	h.tokens = append(slices.Clone(r.Prompt), r.OutputTokens(nil, 0, max(0, r.Generated()-1))...)
	h.tokens = h.tokens[:min(len(h.tokens), len(h.blocks)*bs)]
	c.heldIDs = h.blocks
	p.mu.Lock()
	old := p.holds[h.key]
	p.holds[h.key] = h
	if c.room != nil {
		rm := p.rooms[*c.room]
		if rm == nil || rm.h != nil {
			rm = &room{ready: make(chan struct{}), created: time.Now()}
			p.rooms[*c.room] = rm
		}
		rm.h = h
		close(rm.ready)
	}
	p.mu.Unlock()
	if old != nil && old.rk == rk && old.eng == rk.eng {
		p.log.Warn("a new prefill reused a held key; releasing the older blocks", "key", h.key)
		rk.eng.ReleaseHeld(old.req) // rk.mu is held by the caller
	} else if old != nil {
		// Another rank's blocks: its lock cannot be taken under ours, so the
		// sweeper releases them on its next tick.
		old.key, old.expires, old.stale = "stale:"+old.key, time.Time{}, true
		p.mu.Lock()
		p.holds[old.key] = old
		p.mu.Unlock()
	}
}

// dropRank forgets the holds of rk's engine (a restart replaced it).
// Called with rk.mu held.
func (p *pdState) dropRank(rk *rank) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for k, h := range p.holds {
		if h.rk == rk {
			delete(p.holds, k)
		}
	}
}

// heldCount is the number of holds of rank r (every rank with r < 0).
func (p *pdState) heldCount(r int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for _, h := range p.holds {
		if r < 0 || h.rk.idx == r {
			n++
		}
	}
	return n
}

// prepare applies a request's P/D fields before it is submitted: a decode
// leg reads its KV here (blocking for the modelled transfer time); a
// prefill leg is marked to hold its blocks. It fails only for SGLang
// decode requests whose KV never came (SGLang aborts them).
func (p *pdState) prepare(ctx context.Context, rk *rank, g *gen) error {
	pr := g.pd
	if pr == nil {
		return nil
	}
	if len(g.prompts) != 1 || g.n > 1 {
		p.log.Warn("P/D fields on a request with several prompts or n > 1 are ignored", "request_id", g.id)
		return nil
	}
	if p.cfg.KVTransfer != nil && pr.KVTransferParams != nil {
		kp := pr.KVTransferParams
		switch {
		case isTrue(kp.DoRemotePrefill):
			if p.cfg.KVTransfer.KVRole == "kv_producer" {
				return nil
			}
			g.external = p.nixlRead(ctx, rk, g, kp)
		case isTrue(kp.DoRemoteDecode):
			if p.cfg.KVTransfer.KVRole == "kv_consumer" {
				return nil
			}
			p.mu.Lock()
			p.seq++
			g.pdKey = "req:" + g.id + "-" + strconv.FormatUint(p.seq, 10)
			p.mu.Unlock()
			g.holdIfLength = true
		}
		return nil
	}
	if pr.BootstrapRoom == nil {
		return nil
	}
	switch p.cfg.DisaggregationMode {
	case "prefill":
		room := *pr.BootstrapRoom
		g.room, g.pdKey, g.prefillOnly, g.holdIfLength = &room, "room:"+strconv.FormatUint(room, 10), true, true
	case "decode":
		ext, err := p.bootstrapRead(ctx, rk, g, pr)
		if err != nil {
			p.metrics.failed.WithLabelValues(p.s.cfg.Model, strconv.Itoa(rk.idx)).Inc()
			return &httpError{http.StatusInternalServerError, fmt.Sprintf("KV transfer for bootstrap_room %d failed: %v", *pr.BootstrapRoom, err)}
		}
		g.external = ext
	}
	return nil
}

// responseParams is the kv_transfer_params a finished prefill leg answers
// with: only when it held its blocks (finished by length), as vLLM.
func (p *pdState) responseParams(rk *rank, g *gen, c *call) map[string]any {
	if p == nil || p.cfg.KVTransfer == nil || g.pdKey == "" {
		return nil
	}
	rk.mu.Lock()
	ids := c.heldIDs
	rk.mu.Unlock()
	if ids == nil {
		return nil
	}
	host, portStr, _ := net.SplitHostPort(p.sideAddrs[rk.idx])
	port, _ := strconv.Atoi(portStr)
	return map[string]any{
		"do_remote_prefill": true, "do_remote_decode": false,
		"remote_block_ids": ids, "remote_engine_id": p.cfg.engineID(rk.idx, len(p.s.ranks)),
		"remote_request_id": g.pdKey[len("req:"):], "remote_host": host, "remote_port": port,
		"tp_size": p.cfg.TPSize,
	}
}

func (kp *kvTransferParams) String() string {
	b, _ := json.Marshal(kp)
	return string(b)
}

// SideChannelAddr is rank r's NIXL side-channel address ("" without
// --kv-transfer-config).
func (s *Server) SideChannelAddr(r int) string {
	if s.pd == nil || r >= len(s.pd.sideAddrs) {
		return ""
	}
	return s.pd.sideAddrs[r]
}

// BootstrapAddr is a prefill-mode engine's bootstrap address ("" otherwise).
func (s *Server) BootstrapAddr() string {
	if s.pd == nil || s.cfg.PD.DisaggregationMode != "prefill" {
		return ""
	}
	return s.pd.listeners[0].Addr().String()
}

// EngineID is rank r's NIXL engine id (remote_engine_id).
func (s *Server) EngineID(r int) string {
	if s.pd == nil || s.cfg.PD.KVTransfer == nil {
		return ""
	}
	return s.cfg.PD.engineID(r, len(s.ranks))
}

// HeldRequests is how many finished prefill legs of rank r still hold
// blocks for a decode engine.
func (s *Server) HeldRequests(r int) int {
	if s.pd == nil {
		return 0
	}
	return s.pd.heldCount(r)
}

// pdInfo is GET /kvmesh/pd: the engine's P/D role and endpoints (vLLM has
// no such endpoint; this is the simulator's own).
func (s *Server) handlePDInfo(w http.ResponseWriter, _ *http.Request) {
	type rankInfo struct {
		Rank         int    `json:"rank"`
		EngineID     string `json:"engine_id,omitempty"`
		SideChannel  string `json:"side_channel,omitempty"`
		HeldRequests int    `json:"held_requests"`
		HeldBlocks   int    `json:"held_blocks"`
	}
	out := struct {
		Role               string     `json:"role"`
		KVConnector        string     `json:"kv_connector,omitempty"`
		KVRole             string     `json:"kv_role,omitempty"`
		DisaggregationMode string     `json:"disaggregation_mode,omitempty"`
		Bootstrap          string     `json:"bootstrap,omitempty"`
		TransferGbps       float64    `json:"kv_transfer_gbps,omitempty"`
		Ranks              []rankInfo `json:"ranks"`
	}{Role: s.pdRole()}
	if kc := s.cfg.PD.KVTransfer; kc != nil {
		out.KVConnector, out.KVRole = kc.KVConnector, kc.KVRole
	}
	out.DisaggregationMode, out.Bootstrap = s.cfg.PD.DisaggregationMode, s.BootstrapAddr()
	if s.pd != nil {
		out.TransferGbps = s.cfg.PD.TransferGbps
	}
	for r := range s.ranks {
		out.Ranks = append(out.Ranks, rankInfo{Rank: r, EngineID: s.EngineID(r), SideChannel: s.SideChannelAddr(r),
			HeldRequests: s.HeldRequests(r), HeldBlocks: s.Load(r).HeldBlocks})
	}
	writeJSON(w, http.StatusOK, out)
}

// pdRole is "prefill", "decode", "both" (NIXL kv_both: the request decides)
// or "mixed" (no P/D).
func (s *Server) pdRole() string {
	switch {
	case s.cfg.PD.DisaggregationMode != "":
		return s.cfg.PD.DisaggregationMode
	case s.cfg.PD.KVTransfer == nil:
		return "mixed"
	case s.cfg.PD.KVTransfer.KVRole == "kv_producer":
		return "prefill"
	case s.cfg.PD.KVTransfer.KVRole == "kv_consumer":
		return "decode"
	}
	return "both"
}

// applyPD sets the engine request's P/D fields of call c.
func (g *gen) applyPD(c *call) {
	r := c.req
	r.ExternalTokens = min(g.external, len(r.Prompt))
	if g.prefillOnly {
		r.OutputLen, c.maxOut = 1, 1
	}
	// vLLM holds the blocks only when the request finishes length-capped;
	// the output length is known at submit, so the decision is too.
	if g.holdIfLength && r.OutputLen >= c.maxOut {
		r.HoldBlocks, c.pdKey, c.room = true, g.pdKey, g.room
	}
}

// withKVTransfer adds a top-level kv_transfer_params to a response object,
// as vLLM's prefill engine answers.
func withKVTransfer(resp any, kv map[string]any) any {
	if kv == nil {
		return resp
	}
	b, err := json.Marshal(resp)
	if err != nil || len(b) < 2 || b[len(b)-1] != '}' {
		return resp
	}
	extra, err := json.Marshal(kv)
	if err != nil {
		return resp
	}
	out := append(b[:len(b)-1:len(b)-1], `,"kv_transfer_params":`...)
	out = append(out, extra...)
	return json.RawMessage(append(out, '}'))
}
