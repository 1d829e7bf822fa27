package pd

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// TestKVMeshMixedPrefill: with MixedPrefill a mixed engine may serve the
// prefill leg of another engine of its group when every local prefill
// would push streams past the TPOT objective; never an engine with
// itself, never across groups, and nothing changes without the option.
func TestKVMeshMixedPrefill(t *testing.T) {
	on := Config{MixedPrefill: true, SLOTTFT: 2, SLOTPOT: 0.05}
	off := on
	off.MixedPrefill = false
	busy := 45 * time.Millisecond
	tests := []struct {
		name                    string
		cfg                     Config
		s                       setup
		mode                    Mode
		prefill, decode, reason string
	}{
		{name: "every local prefill breaks streams: the engine with few streams but a slow TPOT prefills, the fast one decodes",
			cfg: on,
			s: setup{prompt: 8192, output: 16, engines: []eng{{id: "m0", role: M, running: 48, tpot: 40 * time.Millisecond},
				{id: "m1", role: M, running: 2, tpot: 55 * time.Millisecond}}},
			mode: Disaggregated, prefill: "m1", decode: "m0", reason: "disaggregated-cheaper"},
		{name: "same engines without the option: aggregated",
			cfg: off,
			s: setup{prompt: 8192, output: 16, engines: []eng{{id: "m0", role: M, running: 48, tpot: 40 * time.Millisecond},
				{id: "m1", role: M, running: 2, tpot: 55 * time.Millisecond}}},
			mode: Aggregated, decode: "m1", reason: "aggregated-no-prefill"},
		{name: "no TPOT objective: no mixed pair",
			cfg: Config{MixedPrefill: true, SLOTTFT: 2},
			s: setup{prompt: 8192, output: 16, engines: []eng{{id: "m0", role: M, running: 48, tpot: 40 * time.Millisecond},
				{id: "m1", role: M, running: 2, tpot: 55 * time.Millisecond}}},
			mode: Aggregated, decode: "m1", reason: "aggregated-cheaper"},
		{name: "an idle engine prefills locally within the objective: aggregated",
			cfg: on,
			s: setup{prompt: 8192, output: 16, engines: []eng{{id: "m0", role: M, running: 48, tpot: busy},
				{id: "m1", role: M, running: 6, tpot: busy}, {id: "m2", role: M}}},
			mode: Aggregated, decode: "m2", reason: "aggregated-cheaper"},
		{name: "one mixed engine: never paired with itself",
			cfg:  on,
			s:    setup{prompt: 8192, output: 16, engines: []eng{{id: "m0", role: M, running: 48, tpot: busy}}},
			mode: Aggregated, decode: "m0", reason: "aggregated-no-prefill"},
		{name: "groups: the light engine of another group is not a prefiller",
			cfg: on,
			s: setup{prompt: 8192, output: 16, engines: []eng{{id: "a0", role: M, group: "a", running: 48, tpot: busy},
				{id: "a1", role: M, group: "a", running: 40, tpot: busy}, {id: "b0", role: M, group: "b", running: 6, tpot: busy}}},
			mode: Aggregated, decode: "b0", reason: "aggregated-cheaper"},
		{name: "a prefill engine still serves as prefiller beside mixed ones",
			cfg: on,
			s: setup{prompt: 8192, output: 16, engines: []eng{{id: "p0", role: P}, {id: "m0", role: M, running: 48, tpot: busy},
				{id: "m1", role: M, running: 6, tpot: busy}}},
			mode: Disaggregated, prefill: "p0", reason: "disaggregated-cheaper"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := route(t, tc.s, mustPolicy(t, tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			if plan.Mode != tc.mode || plan.Prefill != tc.prefill || (tc.decode != "" && plan.Decode != tc.decode) || plan.Reason != tc.reason {
				t.Fatalf("plan %v %q→%q (%s), want %v %q→%q (%s); options %+v", plan.Mode, plan.Prefill, plan.Decode, plan.Reason,
					tc.mode, tc.prefill, tc.decode, tc.reason, plan.Options)
			}
			group := map[string]string{}
			for _, e := range tc.s.engines {
				group[e.id] = e.group
			}
			for _, o := range plan.Options {
				if o.Prefill == "" {
					continue
				}
				if o.Prefill == o.Decode || group[o.Prefill] != group[o.Decode] {
					t.Fatalf("option %q→%q pairs an engine with itself or across groups; options %+v", o.Prefill, o.Decode, plan.Options)
				}
			}
		})
	}
}

// TestMixedPairsNoAlloc: eight mixed engines whose streams are all past
// the TPOT objective offer every ordered pair of distinct engines (8 × 7)
// beside the 8 aggregated options, and routing allocates nothing.
func TestMixedPairsNoAlloc(t *testing.T) {
	keys := kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), make([]uint32, 8192), bs)
	var es []scheduler.Engine
	for i := 0; i < 8; i++ {
		es = append(es, scheduler.Engine{ID: "m" + strconv.Itoa(i), Healthy: true, Model: "m", Role: M, Running: 40, InFlight: 40,
			GPUBlocks: 30000, TPOT: 60 * time.Millisecond})
	}
	outs := NewOutputDist()
	outs.Observe("m", 3, 1)
	r := emptyIndexRouter(t, Config{MixedPrefill: true, SLOTTFT: 2, SLOTPOT: 0.05, Outputs: outs})
	req := scheduler.Request{Keys: keys, BlockSize: bs, PromptTokens: 8192, OutputTokens: 16, Model: "m"}
	var plan Plan
	if err := r.Route(&req, es, &plan); err != nil {
		t.Fatal(err)
	}
	pairs := 0
	for _, o := range plan.Options {
		if o.Prefill != "" {
			pairs++
			if o.Prefill == o.Decode {
				t.Fatalf("option pairs %s with itself", o.Prefill)
			}
		}
	}
	if pairs != 56 || len(plan.Options) != 64 {
		t.Fatalf("%d options, %d pairs; want 64 and 56", len(plan.Options), pairs)
	}
	routeAllocsNothing(t, r, &req, es, &plan)
}

// emptyIndexRouter is a Router with a policy from c over the kvmesh
// scheduler and an empty index.
func emptyIndexRouter(t *testing.T, c Config) *Router {
	t.Helper()
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sc := scheduler.DefaultConfig()
	sc.Policy = "kvmesh"
	sched, err := registry.New(sc, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(sched, mustPolicy(t, c))
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// routeAllocsNothing fails when routing req over es allocates (the guard
// runs without the race detector: unit-norace).
func routeAllocsNothing(t *testing.T, r *Router, req *scheduler.Request, es []scheduler.Engine, plan *Plan) {
	t.Helper()
	if raceEnabled {
		return
	}
	if n := testing.AllocsPerRun(100, func() { _ = r.Route(req, es, plan) }); n != 0 {
		t.Fatalf("Route allocates %v times", n)
	}
}
