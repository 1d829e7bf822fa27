package epp

import (
	"context"
	"testing"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
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
	res, err := env.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: long}, false)
	if err != nil {
		t.Fatal(err)
	}
	if res.dest != m.ep["eng-d"] || res.metaDest != res.dest || res.prefiller != m.ep["eng-p"] || len(res.removed) != 0 {
		t.Fatalf("P/D: destination %q (want %s only), prefiller %q (want %s), removed %v", res.dest, m.ep["eng-d"], res.prefiller, m.ep["eng-p"], res.removed)
	}

	short := []byte(completionsBody("short", false))
	if res, err = env.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: short}, false); err != nil {
		t.Fatal(err)
	}
	checkRouting(t, res, m.ep["eng-d"], 1) // no prefiller, a client's header removed
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
