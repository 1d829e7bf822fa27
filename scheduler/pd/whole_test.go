package pd

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
)

// TestKVMeshWholeOnPrefill: a prefill engine is offered a whole request only
// when the request's TPOT would more likely than not miss the objective on
// every engine that decodes; never when it is PrefillOnly (SGLang's prefill
// servers), never for kvmesh-always, never without a TPOT objective.
func TestKVMeshWholeOnPrefill(t *testing.T) {
	slo := Config{SLOTTFT: 2, SLOTPOT: 0.05}
	always := slo
	always.Policy = "kvmesh-always"
	saturated := []eng{{id: "p0", role: P}, {id: "d0", role: D, running: 60, tpot: 80 * time.Millisecond},
		{id: "d1", role: D, running: 58, tpot: 75 * time.Millisecond}}
	only := []eng{{id: "p0", role: P, prefillOnly: true}, saturated[1], saturated[2]}
	tests := []wholeCase{
		{name: "decode engines keep TPOT: prefill engine takes legs only", cfg: slo,
			s: setup{prompt: 1024, output: 256, engines: []eng{{id: "p0", role: P},
				{id: "d0", role: D, running: 8, tpot: 30 * time.Millisecond}, {id: "d1", role: D, running: 60, tpot: 80 * time.Millisecond}}}},
		{name: "every decode engine past the objective: the prefill engine serves it whole", cfg: slo,
			s: setup{prompt: 1024, output: 256, engines: saturated}, offer: true, reason: "aggregated-on-prefill"},
		{name: "a prefill-only engine is never offered", cfg: slo, s: setup{prompt: 1024, output: 256, engines: only}},
		{name: "kvmesh-always never aggregates", cfg: always, s: setup{prompt: 1024, output: 256, engines: saturated}},
		{name: "no TPOT objective, no gate to open", cfg: Config{SLOTTFT: 2}, s: setup{prompt: 1024, output: 256, engines: saturated}},
	}
	checkWholeOnP0(t, tests)
}

// TestKVMeshWholeOnPrefillKVFull: a prefill engine is also offered a whole
// request when no engine that decodes has the KV for it before its TTFT
// objective has passed (the KV wait alone ≥ SLOTTFT on each), though their
// TPOT is fine: a KV-bound decode pool is left, not queued on (tester h-reg7
// U2; docs/BENCHMARKS.md, "The KV wait's form (2026-12-07)"). Not while one decode engine
// has room, not when the wait is short (short outputs free KV soon), never
// on a PrefillOnly engine, never for kvmesh-always, never without a TTFT
// objective.
func TestKVMeshWholeOnPrefillKVFull(t *testing.T) {
	slo := Config{SLOTTFT: 2, SLOTPOT: 0.05}
	always := slo
	always.Policy = "kvmesh-always"
	const blocks = 4096
	// Streams within their TPOT objective, the KV over-committed by 1,000
	// blocks (the router's in-flight requests beyond the full snapshot).
	full := func(id string) eng {
		return eng{id: id, role: D, running: 8, tpot: 30 * time.Millisecond, blocks: blocks, kvUsage: 1, kv: (blocks + 1000) * bs}
	}
	kvBound := []eng{{id: "p0", role: P}, full("d0"), full("d1")}
	room := []eng{{id: "p0", role: P}, full("d0"), {id: "d1", role: D, running: 8, tpot: 30 * time.Millisecond, blocks: blocks}}
	only := []eng{{id: "p0", role: P, prefillOnly: true}, full("d0"), full("d1")}
	long := func(e []eng) setup { return setup{prompt: 4096, output: 1024, engines: e} } // 320 blocks, a ~20 s lifetime
	tests := []wholeCase{
		{name: "every decode engine KV-bound: the prefill engine serves it whole", cfg: slo, s: long(kvBound),
			offer: true, reason: "aggregated-on-prefill"},
		{name: "one decode engine has room", cfg: slo, s: long(room)},
		{name: "short outputs free KV soon: the wait stays inside the objective", cfg: slo,
			s: setup{prompt: 4096, output: 64, engines: kvBound}},
		{name: "a prefill-only engine is never offered", cfg: slo, s: long(only)},
		{name: "kvmesh-always never aggregates", cfg: always, s: long(kvBound)},
		{name: "no TTFT objective, no KV gate", cfg: Config{SLOTPOT: 0.05}, s: long(kvBound)},
	}
	checkWholeOnP0(t, tests)
}

// wholeCase is a routing setup and whether it offers the prefill engine p0
// a whole request.
type wholeCase struct {
	name   string
	cfg    Config
	s      setup
	offer  bool   // an aggregated option on p0
	reason string // "" any
}

// checkWholeOnP0 routes each case and checks the whole-request option on
// p0 and, with a reason, that the plan took it.
func checkWholeOnP0(t *testing.T, tests []wholeCase) {
	t.Helper()
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := route(t, tc.s, mustPolicy(t, tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			offered := false
			for _, o := range plan.Options {
				offered = offered || (o.Prefill == "" && o.Decode == "p0")
			}
			if offered != tc.offer {
				t.Fatalf("whole request on p0 offered %v, want %v; options %+v", offered, tc.offer, plan.Options)
			}
			if tc.reason != "" && (plan.Reason != tc.reason || plan.Decode != "p0" || plan.Mode != Aggregated) {
				t.Fatalf("plan %v %q→%q (%s), want aggregated on p0 (%s); options %+v", plan.Mode, plan.Prefill, plan.Decode,
					plan.Reason, tc.reason, plan.Options)
			}
		})
	}
}

// TestWholeOnPrefillNoAlloc: routing with the gate open allocates nothing.
func TestWholeOnPrefillNoAlloc(t *testing.T) {
	keys := kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), make([]uint32, 1024), bs)
	es := []scheduler.Engine{{ID: "p0", Healthy: true, Model: "m", Role: P, GPUBlocks: 30000}}
	for _, id := range []string{"d0", "d1"} {
		es = append(es, scheduler.Engine{ID: id, Healthy: true, Model: "m", Role: D, Running: 60, InFlight: 60,
			GPUBlocks: 30000, TPOT: 80 * time.Millisecond})
	}
	r := emptyIndexRouter(t, Config{SLOTTFT: 2, SLOTPOT: 0.05})
	req := scheduler.Request{Keys: keys, BlockSize: bs, PromptTokens: 1024, OutputTokens: 256, Model: "m"}
	var plan Plan
	if err := r.Route(&req, es, &plan); err != nil {
		t.Fatal(err)
	}
	if plan.Decode != "p0" || plan.Mode != Aggregated {
		t.Fatalf("plan %v %q→%q, want aggregated on p0", plan.Mode, plan.Prefill, plan.Decode)
	}
	routeAllocsNothing(t, r, &req, es, &plan)
}
