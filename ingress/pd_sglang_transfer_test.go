package ingress

import (
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// closedAddr is a loopback address where nothing listens.
func closedAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// TestSGLangBootstrapRefusedMarksPrefill: a prefill engine gossiping a
// bootstrap address where nothing listens (a sidecar's --bootstrap-port
// left at 8998 beside an engine on another port) answers its legs 200, but
// no decode engine can read its rooms: each decode leg fails with a 500
// saying it could not read the room. That is the prefill side's failure: the
// decode engines are not charged with it (they used to be ejected for
// status_5xx while the prefill engine took every request's leg), the
// prefill engine is left out of prefill legs for a backoff, a warning
// names it and its bootstrap address, and the failure is counted
// (legs{leg="decode",result="failed_kv_transfer"}); the request is served
// aggregated, and the access log says why (fallback_kv_transfer).
func TestSGLangBootstrapRefusedMarksPrefill(t *testing.T) {
	base := sim.Config{Model: "m", TimeScale: 100, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base, Prefill: 1, Decode: 2})
	wrong := closedAddr(t)
	pe := sglangEngine("p0", scheduler.RolePrefill, cl.Prefill[0])
	pe.Bootstrap = wrong
	var logs, access testutil.SyncBuffer
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil)), AccessLog: slog.New(slog.NewJSONHandler(&access, nil)),
		Membership: roleMembership{pe, sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0]), sglangEngine("d1", scheduler.RoleDecode, cl.Decode[1])}})
	for i := 0; i < 6; i++ {
		st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"refused `+strings.Repeat("word ", 40+i)+`","max_tokens":3}`)
		if e := hdr.Get("X-Kvmesh-Engine"); st != 200 || (e != "d0" && e != "d1") {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, e, b)
		}
	}
	for _, id := range []string{"d0", "d1"} {
		up := s.ups.lookup(id)
		if up == nil {
			continue // never used
		}
		if f := up.failures.Load(); f != 0 || !s.health.allowed(id) {
			t.Fatalf("decode engine %s charged with %d failures (allowed %v) for the prefill engine's bootstrap", id, f, s.health.allowed(id))
		}
	}
	p := s.pdInit()
	if n := val(p.legs.WithLabelValues("decode", "failed_kv_transfer")); n != 1 {
		t.Fatalf("%v decode legs counted as failed transfers, want 1 (the prefill engine left out after it)", n)
	}
	if !p.noKVMarked("p0", time.Now()) {
		t.Fatal("the prefill engine whose rooms cannot be read is not left out of prefill legs")
	}
	if v := val(p.decisions.WithLabelValues("aggregated", "sglang_fallback")); v != 1 {
		t.Fatalf("%v SGLang fallbacks, want 1", v)
	}
	l := logs.String()
	if !strings.Contains(l, "level=WARN") || !strings.Contains(l, "engine=p0") || !strings.Contains(l, "bootstrap="+wrong) {
		t.Fatalf("no warning naming the prefill engine and its bootstrap address %s:\n%s", wrong, l)
	}
	testutil.WaitFor(t, 10*time.Second, "the access log lines", func() bool { return strings.Count(access.String(), `"prefill_result"`) == 6 })
	if a := access.String(); strings.Count(a, `"prefill_result":"fallback_kv_transfer"`) != 1 || strings.Contains(a, `"prefill_result":"concurrent"`) {
		t.Fatalf("access log: want one fallback_kv_transfer and no concurrent (the other requests planned aggregated):\n%s", a)
	}
}

// sglangTransferFailure is the answer of an SGLang decode engine that could
// not read its room (decode.py's abort of a failed transfer).
const sglangTransferFailure = `{"object":"error","message":"Decode transfer failed for request rank=0 decode_req.req.rid='r1' ` +
	`decode_req.req.bootstrap_room=7 with exception KVTransferError(bootstrap_room=7): Failed to get kvcache from prefill instance, it might be dead",` +
	`"type":"InternalServerError","param":null,"code":500}`

// TestSGLangTransferFailureCutsPrefill: real SGLang answers a prefill leg
// only once the room's KV is sent (or at its bootstrap timeout), so when
// the decode engine reports that it could not read the room the prefill
// leg still runs, holding the room and an admission slot: the ingress cuts
// it (SGLang aborts a request whose client left, freeing the room),
// counts it failed_kv_transfer, and holds it against neither engine's
// health. The request is served aggregated.
func TestSGLangTransferFailureCutsPrefill(t *testing.T) {
	gone, started := make(chan struct{}), make(chan struct{})
	var once, startOnce sync.Once
	prefill := httpFake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		startOnce.Do(func() { close(started) })
		select {
		case <-r.Context().Done():
			once.Do(func() { close(gone) })
		case <-time.After(time.Minute):
		}
	})
	decode := httpFake(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		if strings.Contains(string(b), "bootstrap_room") {
			// As a real decode server, which fails a room only after
			// its prefill server took the request: the legs are sent
			// at once, and a failure answered first could have the
			// prefill leg cut before the fake engine saw it.
			select {
			case <-started:
			case <-time.After(30 * time.Second):
			}
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, sglangTransferFailure)
			return
		}
		io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ok","finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})
	pe := pdEngine("p0", scheduler.RolePrefill, prefill)
	pe.PDProtocol, pe.Bootstrap = gossip.PDProtocolSGLang, closedAddr(t)
	de := pdEngine("d0", scheduler.RoleDecode, decode)
	de.PDProtocol = gossip.PDProtocolSGLang
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Membership: roleMembership{pe, de}})
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"cut the prefill leg","max_tokens":1}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	select {
	case <-gone:
	case <-time.After(30 * time.Second):
		t.Fatal("the prefill leg was not cut after its decode leg could not read the room")
	}
	p := s.pdInit()
	testutil.WaitFor(t, 10*time.Second, "the prefill leg counted", func() bool {
		return val(p.legs.WithLabelValues("prefill", "failed_kv_transfer")) == 1
	})
	for _, id := range []string{"p0", "d0"} {
		if f := s.ups.lookup(id).failures.Load(); f != 0 || !s.health.allowed(id) {
			t.Fatalf("engine %s charged with %d failures (allowed %v)", id, f, s.health.allowed(id))
		}
	}
	if !p.noKVMarked("p0", time.Now()) || val(p.legs.WithLabelValues("decode", "failed_kv_transfer")) != 1 {
		t.Fatal("the prefill engine is not left out of prefill legs, or the failed transfer is not counted")
	}
}

// TestSGLangFallbackAccessLog: an SGLang request whose pairs were all
// given up before a leg ran (full prefill queues) is logged with the
// fallback's reason, as on the NIXL path, not "concurrent" (it was set
// before the pairs were tried).
func TestSGLangFallbackAccessLog(t *testing.T) {
	base := sim.Config{Model: "m", TimeScale: 100, Seed: 1, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))}
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: base, Prefill: 2, Decode: 1})
	var access testutil.SyncBuffer
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{AccessLog: slog.New(slog.NewJSONHandler(&access, nil)), Membership: roleMembership{
		sglangEngine("p0", scheduler.RolePrefill, cl.Prefill[0]), sglangEngine("p1", scheduler.RolePrefill, cl.Prefill[1]),
		sglangEngine("d0", scheduler.RoleDecode, cl.Decode[0])}})
	p := s.pdInit()
	fillPrefillQueues(p, "p0", "p1")
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"full `+strings.Repeat("word ", 60)+`","max_tokens":3}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	testutil.WaitFor(t, 10*time.Second, "the access log line", func() bool { return strings.Contains(access.String(), `"prefill_result"`) })
	if a := access.String(); !strings.Contains(a, `"pd_mode":"fallback"`) || !strings.Contains(a, `"prefill_result":"fallback_queue_full"`) {
		t.Fatalf("access log %s", a)
	}
}

// httpFake is a FAKE engine's HTTP side served by h on loopback.
func httpFake(t *testing.T, h http.HandlerFunc) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// TestKVTransferFailedMessages: a decode engine's 5xx is taken for a room
// it could not read only when it says so, as SGLang's aborts and the
// simulator's do; a 5xx that quotes the request (which holds the
// bootstrap_room the ingress injected) is the decode engine's own.
func TestKVTransferFailedMessages(t *testing.T) {
	for _, c := range []struct {
		body string
		want bool
	}{
		{sglangTransferFailure, true},
		{`{"object":"error","message":"Decode handshake failed for request rank=0 decode_req.req.rid='r2' decode_req.req.bootstrap_room=9 with exception ` +
			`KVTransferError(bootstrap_room=9): Failed to get kvcache from prefill instance","code":500}`, true},
		{`{"error":{"message":"Decode handshake failed for request rank=0 rid=r3 bootstrap_room=11: timeout"}}`, true},
		{`{"error":{"message":"KV transfer for bootstrap_room 42 failed: dial tcp 127.0.0.1:8998: connect: connection refused","type":"server_error"}}`, true},
		{`{"object":"error","message":"Internal error: CUDA out of memory while handling request {\"model\": \"m3\", \"bootstrap_room\": 660851}","code":500}`, false},
		{`{"detail":"GenerateReqInput(text='hi', bootstrap_host='127.0.0.1', bootstrap_port=8998, bootstrap_room=7) failed"}`, false},
		{`internal server error`, false},
	} {
		if got := kvTransferFailed([]byte(c.body)); got != c.want {
			t.Errorf("kvTransferFailed(%s) = %v, want %v", c.body, got, c.want)
		}
	}
}

// fakeSGLangPrefill is a FAKE SGLang prefill engine: it answers every leg
// 200 at once (the simulator's prefill engine answers before its room is
// read too).
func fakeSGLangPrefill(t *testing.T, id string) EngineInfo {
	t.Helper()
	u := httpFake(t, func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-p","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})
	e := pdEngine(id, scheduler.RolePrefill, u)
	e.PDProtocol, e.Bootstrap = gossip.PDProtocolSGLang, closedAddr(t)
	return e
}

// fakeSGLangDecode is a FAKE SGLang decode engine: a leg carrying a
// bootstrap_room (any request when failAll) is answered by fail (a 500
// with its body) when fail is set, and a completion otherwise; legs counts
// the legs it was sent.
func fakeSGLangDecode(t *testing.T, id string, fail func(body []byte) string, failAll bool, legs *atomic.Int64) EngineInfo {
	t.Helper()
	u := httpFake(t, func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		w.Header().Set("Content-Type", "application/json")
		room := strings.Contains(string(b), "bootstrap_room")
		if room {
			legs.Add(1)
		}
		if fail != nil && (room || failAll) {
			w.WriteHeader(http.StatusInternalServerError)
			io.WriteString(w, fail(b))
			return
		}
		io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ok","finish_reason":"length"}],`+
			`"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`)
	})
	e := pdEngine(id, scheduler.RoleDecode, u)
	e.PDProtocol = gossip.PDProtocolSGLang
	return e
}

// TestSGLangDecodeQuotingRoomIsItsOwnFailure (tester h-reg5 F1): a bad
// decode engine whose 500 quotes the request ("CUDA out of memory while
// handling request {... "bootstrap_room": N}") did not fail a room: it
// failed. Every prefill engine used to be left out of prefill legs on the
// first request (its 5xx named bootstrap_room), so the requests after it
// went aggregated while a healthy decode engine idled, and the bad engine's
// failures were never held against it. Now no prefill engine is marked,
// the bad engine is charged (and ejected), and the requests keep P/D on
// the healthy pair.
func TestSGLangDecodeQuotingRoomIsItsOwnFailure(t *testing.T) {
	var badLegs, goodLegs atomic.Int64
	echo := func(b []byte) string {
		var m map[string]any
		_ = json.Unmarshal(b, &m)
		q, _ := json.Marshal(map[string]any{"model": m["model"], "bootstrap_room": m["bootstrap_room"]})
		msg, _ := json.Marshal("Internal error: CUDA out of memory while handling request " + string(q))
		return `{"object":"error","message":` + string(msg) + `,"type":"InternalServerError","code":500}`
	}
	var access testutil.SyncBuffer
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{AccessLog: slog.New(slog.NewJSONHandler(&access, nil)), Membership: roleMembership{
		fakeSGLangPrefill(t, "p1"), fakeSGLangPrefill(t, "p2"),
		fakeSGLangDecode(t, "bad", echo, true, &badLegs), fakeSGLangDecode(t, "d1", nil, false, &goodLegs)}})
	const n = 30
	for i := 0; i < n; i++ {
		st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"quoted `+strings.Repeat("word ", 20+i)+`","max_tokens":1}`)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d1" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if badLegs.Load() == 0 {
		t.Fatal("the bad decode engine was never sent a leg: the test proves nothing")
	}
	p := s.pdInit()
	for _, id := range []string{"p1", "p2"} {
		if p.noKVMarked(id, time.Now()) {
			t.Fatalf("prefill engine %s left out of prefill legs for the decode engine's own 500", id)
		}
	}
	if v := val(p.legs.WithLabelValues("decode", "failed_kv_transfer")); v != 0 {
		t.Fatalf("%v decode legs counted as failed transfers, want 0", v)
	}
	testutil.WaitFor(t, 10*time.Second, "the bad decode engine charged", func() bool {
		up := s.ups.lookup("bad")
		return up != nil && up.failures.Load() > 0
	})
	testutil.WaitFor(t, 10*time.Second, "the access log lines", func() bool { return strings.Count(access.String(), `"prefill_result"`) == n })
	if d := strings.Count(access.String(), `"pd_mode":"disaggregated"`); d < n-int(badLegs.Load()) {
		t.Fatalf("%d of %d requests served disaggregated, %d legs on the bad engine:\n%s", d, n, badLegs.Load(), access.String())
	}
	if goodLegs.Load() == 0 {
		t.Fatal("no leg on the healthy decode engine")
	}
}

// TestSGLangDecodeFailingTwoPrefillEnginesCharged: a decode engine that
// cannot read the rooms of two prefill engines (SGLang's "Decode transfer
// failed" for both) is the one at fault: its failure is held against its
// health, the second prefill engine is not left out of prefill legs, and
// the first one's mark, put for the same decode engine's failure, is
// undone. One bad decode engine used to take every prefill engine out of
// P/D.
func TestSGLangDecodeFailingTwoPrefillEnginesCharged(t *testing.T) {
	var legs atomic.Int64
	var logs testutil.SyncBuffer
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	s := startIngress(t, c, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Membership: roleMembership{
		fakeSGLangPrefill(t, "p1"), fakeSGLangPrefill(t, "p2"),
		fakeSGLangDecode(t, "bad", func([]byte) string { return sglangTransferFailure }, false, &legs)}})
	st, hdr, b := post(t, boundedClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"two prefill engines","max_tokens":1}`)
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "bad" { // aggregated: the fake answers a leg without a room
		t.Fatalf("status %d engine %q body %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	p := s.pdInit()
	if v := val(p.legs.WithLabelValues("decode", "failed_kv_transfer")); v != 2 || legs.Load() != 2 {
		t.Fatalf("%v decode legs counted as failed transfers, %d sent, want 2 (one per prefill engine)", v, legs.Load())
	}
	for _, id := range []string{"p1", "p2"} {
		if p.noKVMarked(id, time.Now()) {
			t.Fatalf("prefill engine %s left out of prefill legs for the decode engine's failures", id)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the decode engine charged", func() bool {
		return s.ups.lookup("bad").failures.Load() == 1
	})
	if l := logs.String(); !strings.Contains(l, "decode_engine=bad") || !strings.Contains(l, "rooms of two prefill engines") {
		t.Fatalf("no warning naming the decode engine:\n%s", l)
	}
}

// TestSGLangBlameEveryPrefillWrong: when every prefill engine's rooms fail
// (each one's bootstrap address wrong), a decode engine fails the rooms of
// two prefill engines too; once a second decode engine fails the same
// prefill engines' rooms, the fault is theirs again, not the decode
// engines'.
func TestSGLangBlameEveryPrefillWrong(t *testing.T) {
	p := &pdState{noKV: map[string]*noKVMark{}}
	now := time.Now()
	step := func(decode, prefill string, want bool) {
		t.Helper()
		if got, _, _ := p.blameLocked(decode, prefill, now); got != want {
			t.Fatalf("%s failing a room of %s: decode at fault %v, want %v", decode, prefill, got, want)
		}
		if !want {
			p.markLocked(prefill, now)
		}
	}
	step("d0", "p1", false)
	step("d0", "p2", true) // d0 failed two prefill engines' rooms: its fault, p1's mark undone
	if p.noKVMarked("p1", now.Add(time.Millisecond)) {
		t.Fatal("p1's mark, put for d0's failure, is not undone")
	}
	step("d1", "p1", false)
	step("d1", "p2", false) // p2's rooms failed on d0 too: p2's fault
	step("d0", "p1", false) // p1's rooms failed on d1 too
}
