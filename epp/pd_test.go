package epp

import (
	"context"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestPrefillerHeader: with P/D on, destinations are decode engines and a
// long uncached prompt names the prefill engine in x-prefiller-host-port
// (llm-d's routing sidecar header); a short one runs whole on decode.
func TestPrefillerHeader(t *testing.T) {
	m := newMesh(t)
	cfg := DefaultConfig()
	cfg.PD = PDConfig{Enabled: true, MinUncachedTokens: 64}
	s, r := m.startEPP("epp-pd", cfg, Deps{}, nil)
	m.addEngine("eng-d", "decode", 1)
	m.addEngine("eng-p", "prefill", 2)
	m.waitEngines(r, 2)
	env := newEnvoy(t, s.Addr(), extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
	ctx := context.Background()

	long := []byte(completionsBody(words("long-uncached", 300), false))
	// Until the decode engine's gossiped state passes the scheduler's
	// filters (health), only the prefill engine is ranked: 503.
	var res *exchangeResult
	testutil.WaitFor(t, 20*time.Second, "the decode engine ranked", func() bool {
		var err error
		res, err = env.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: long}, false)
		if err != nil && (res == nil || res.immediate == nil || res.immediate.GetStatus().GetCode() != 503) {
			t.Fatal(err)
		}
		return err == nil
	})
	var err error
	if res.dest != m.ep["eng-d"] || res.metaDest != res.dest || res.prefiller != m.ep["eng-p"] || len(res.removed) != 0 {
		t.Fatalf("P/D: destination %q (want %s only), prefiller %q (want %s), removed %v", res.dest, m.ep["eng-d"], res.prefiller, m.ep["eng-p"], res.removed)
	}

	short := []byte(completionsBody("short", false))
	if res, err = env.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: short}, false); err != nil {
		t.Fatal(err)
	}
	checkRouting(t, res, m.ep["eng-d"], 1) // no prefiller, a client's header removed

	// A bodyless request goes to decode engines too (it went to the
	// least-loaded endpoints, prefill engines among them).
	if res, err = env.do(ctx, httpRequest{method: "GET", path: "/health"}, true); err != nil {
		t.Fatal(err)
	}
	if res.dest != m.ep["eng-d"] {
		t.Fatalf("bodyless request with P/D: destination %q, want %s only", res.dest, m.ep["eng-d"])
	}
}

func TestUncachedThresholdNeedsAPrefillEngine(t *testing.T) {
	// The rule never names a decode or mixed engine as the prefiller: with
	// only mixed engines in the mesh, P/D on changes nothing.
	m := newMesh(t)
	cfg := DefaultConfig()
	cfg.PD = PDConfig{Enabled: true, MinUncachedTokens: 1}
	s, r := m.startEPP("epp-pd-mixed", cfg, Deps{}, nil)
	m.addEngine("eng-a", "", 1)
	m.waitEngines(r, 1)
	env := newEnvoy(t, s.Addr(), extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
	res, err := env.do(context.Background(), httpRequest{method: "POST", path: "/v1/completions", body: []byte(completionsBody(words("x", 200), false))}, false)
	if err != nil {
		t.Fatal(err)
	}
	checkRouting(t, res, m.ep["eng-a"], 1)
}
