package ingress

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
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
// naming the bootstrap_room. That is the prefill side's failure: the
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
