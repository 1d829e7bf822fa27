// Package simtest starts groups of simulators for tests, benchmarks and the
// demo: today a prefill/decode cluster on loopback. It owns nothing but the
// servers it starts.
package simtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"testing"

	"github.com/kvmesh/kvmesh/sim"
)

// Protocol selects the P/D wire protocol of a cluster.
type Protocol string

const (
	// NIXL is vLLM's NixlConnector protocol (kv_transfer_params).
	NIXL Protocol = "nixl"
	// SGLang is SGLang's bootstrap protocol (bootstrap_host/port/room).
	SGLang Protocol = "sglang"
)

// PDOptions describes a P/D cluster.
type PDOptions struct {
	// Base is every engine's configuration. HTTPAddr, and KVEvents/KVReplay
	// when set, must use port 0 (each engine gets its own ports); PD is
	// filled in per role. Model names must match across the cluster.
	Base sim.Config
	// Prefill and Decode are the engine counts. Default 1 each.
	Prefill, Decode int
	// Protocol defaults to NIXL.
	Protocol Protocol
	// PortBase, when > 0, puts engine i (the prefill engines first) on
	// 127.0.0.1 ports PortBase+2i (HTTP) and PortBase+2i+1 (NIXL's side
	// channel, or SGLang's bootstrap server): PDPorts ports in all. 0: free
	// ports.
	PortBase int
}

// PDPorts is how many ports from PDOptions.PortBase on a cluster of
// engines takes.
func PDPorts(engines int) int { return 2 * engines }

// PD is a running P/D cluster.
type PD struct {
	Prefill  []*sim.Server
	Decode   []*sim.Server
	Protocol Protocol
}

// StartPD starts o.Prefill prefill and o.Decode decode simulators on
// loopback. With NIXL every engine runs kv_both (as vLLM deployments do:
// the request decides the role) and the role is only which list it is in;
// with SGLang the engines run --disaggregation-mode prefill or decode.
func StartPD(ctx context.Context, o PDOptions) (*PD, error) {
	if o.Prefill == 0 {
		o.Prefill = 1
	}
	if o.Decode == 0 {
		o.Decode = 1
	}
	if o.Protocol == "" {
		o.Protocol = NIXL
	}
	pd := &PD{Protocol: o.Protocol}
	start := func(role string, i int) (*sim.Server, error) {
		cfg := o.Base
		pdPort := 0
		if o.PortBase > 0 {
			cfg.HTTPAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(o.PortBase+2*i))
			pdPort = o.PortBase + 2*i + 1
		}
		switch o.Protocol {
		case NIXL:
			if cfg.PD.KVTransfer == nil {
				cfg.PD.KVTransfer = &sim.KVTransferConfig{KVConnector: "NixlConnector", KVRole: "kv_both"}
			}
			cfg.PD.SideChannelPort = pdPort
		case SGLang:
			cfg.PD.DisaggregationMode = role
			cfg.PD.BootstrapAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(pdPort))
		default:
			return nil, fmt.Errorf("simtest: unknown protocol %q", o.Protocol)
		}
		return sim.Start(ctx, cfg)
	}
	for i := 0; i < o.Prefill+o.Decode; i++ {
		role := "prefill"
		if i >= o.Prefill {
			role = "decode"
		}
		s, err := start(role, i)
		if err != nil {
			return nil, errors.Join(fmt.Errorf("simtest: start %s engine %d: %w", role, i, err), pd.Close())
		}
		if role == "prefill" {
			pd.Prefill = append(pd.Prefill, s)
		} else {
			pd.Decode = append(pd.Decode, s)
		}
	}
	return pd, nil
}

// StartPDForTest starts a cluster closed when tb ends.
func StartPDForTest(tb testing.TB, o PDOptions) *PD {
	tb.Helper()
	pd, err := StartPD(context.Background(), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := pd.Close(); err != nil {
			tb.Errorf("close P/D cluster: %v", err)
		}
	})
	return pd
}

// Close stops every engine; it is idempotent.
func (p *PD) Close() error {
	var errs []error
	for _, s := range append(append([]*sim.Server(nil), p.Prefill...), p.Decode...) {
		errs = append(errs, s.Close())
	}
	return errors.Join(errs...)
}

// BootstrapFields are the SGLang request fields that send a request to
// prefill engine i (bootstrap_host, bootstrap_port; the caller adds a
// random bootstrap_room). Nil for NIXL clusters.
func (p *PD) BootstrapFields(i int) map[string]any {
	addr := p.Prefill[i].BootstrapAddr()
	if addr == "" {
		return nil
	}
	host, port, _ := net.SplitHostPort(addr)
	n, _ := strconv.Atoi(port)
	return map[string]any{"bootstrap_host": host, "bootstrap_port": n}
}
