package openai

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// roleMembership lists the P/D cluster's engines with their roles (the
// static engine list has none; gossip carries them in production).
type roleMembership []ingress.EngineInfo

func (m roleMembership) Engines(dst []ingress.EngineInfo) []ingress.EngineInfo {
	return append(dst, m...)
}

// PDMembership lists a simulated P/D cluster for an ingress.
func pdMembership(c *simtest.PD, model string) roleMembership {
	var m roleMembership
	add := func(id string, role scheduler.Role, s *sim.Server) {
		m = append(m, ingress.EngineInfo{Engine: scheduler.Engine{ID: id, Model: model, Healthy: true, Role: role}, URL: s.URL()})
	}
	for i, s := range c.Prefill {
		add("prefill-"+string(rune('a'+i)), scheduler.RolePrefill, s)
	}
	for i, s := range c.Decode {
		add("decode-"+string(rune('a'+i)), scheduler.RoleDecode, s)
	}
	return m
}

// TestOpenAINodeClientPD: the same client and the same shape checks as
// TestOpenAINodeClient, against a P/D cluster (1 prefill + 1 decode
// simulator speaking vLLM's NIXL protocol over a real side channel) where
// every single-prompt request is disaggregated: the two legs are invisible
// to the client.
func TestOpenAINodeClientPD(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	node, dir := installClient(t)
	const model = "e2e-model"
	cl := simtest.StartPDForTest(t, simtest.PDOptions{Base: sim.Config{Model: model, TimeScale: 200, Seed: 1, Logger: quiet, HTTPAddr: "127.0.0.1:0"}})
	cfg := ingress.DefaultConfig()
	cfg.PD.Policy = "kvmesh-always"
	srv := startIngress(t, ctx, cfg, ingress.Deps{Auth: keyStore(t, dir), Membership: pdMembership(cl, model)})
	checkClient(t, ctx, node, dir, srv.Addr(), model)
	if l := cl.Prefill[0].Load(0); l.Finished == 0 || l.GenerationTokens != l.Finished {
		t.Errorf("prefill engine ran %d requests, %d output tokens: want prefill legs (one token each)", l.Finished, l.GenerationTokens)
	}
	// The decode engine tells the prefill engine it read the blocks off the
	// request path (as vLLM's NIXL notification), so the client's answer
	// may come first: freed within seconds, not at the 480 s abort timeout.
	testutil.WaitFor(t, 30*time.Second, "the prefill engine to free every request's blocks after its decode read", func() bool {
		return cl.Prefill[0].HeldRequests(0) == 0
	})
}
