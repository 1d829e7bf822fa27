package openai

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// TestOpenAINodeClientSGLangPD: the same client and shape checks as
// TestOpenAINodeClient against a P/D cluster of SGLang-mode simulators
// (--disaggregation-mode prefill|decode, a real bootstrap server on
// loopback), where every single-prompt request goes to both engines at
// once with one bootstrap room: the two legs are invisible to the client.
func TestOpenAINodeClientSGLangPD(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node, dir := installClient(t)
	const model = "e2e-model"
	cl := simtest.StartSGLangForTest(t, simtest.PDOptions{Base: sim.Config{Model: model, TimeScale: 200, Seed: 1, Logger: quiet, HTTPAddr: "127.0.0.1:0"}})
	m := pdMembership(cl, model)
	for i := range m {
		m[i].PDProtocol = gossip.PDProtocolSGLang
	}
	m[0].Bootstrap = cl.Prefill[0].BootstrapAddr()
	cfg := ingress.DefaultConfig()
	cfg.PD.Policy = "kvmesh-always"
	srv := startIngress(t, ctx, cfg, ingress.Deps{Auth: keyStore(t, dir), Membership: m})
	checkClient(t, ctx, node, dir, srv.Addr(), model)
	// Both legs are sent at once and the client's answer comes from the
	// decode engine: the prefill legs may end (one token each) and free
	// their blocks, once the decode engine has them, after it.
	testutil.WaitFor(t, 30*time.Second, "prefill legs (one token each) that free their blocks after the decode read", func() bool {
		l := cl.Prefill[0].Load(0)
		return l.Finished > 0 && l.GenerationTokens == l.Finished && cl.Prefill[0].HeldRequests(0) == 0
	})
}
