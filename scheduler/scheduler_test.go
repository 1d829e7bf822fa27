package scheduler_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

func keys(n int, base uint64) []uint64 {
	k := make([]uint64, n)
	for i := range k {
		k[i] = base + uint64(i)*7919 + 1
	}
	return k
}

func engines(n int) []scheduler.Engine {
	es := make([]scheduler.Engine, n)
	for i := range es {
		es[i] = scheduler.Engine{ID: string(rune('a' + i)), Healthy: true, Model: "m"}
	}
	return es
}

func newIdx(t testing.TB) *index.Index {
	x, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

func TestScheduleRanksAndFilters(t *testing.T) {
	x := newIdx(t)
	k := keys(16, 100)
	x.Store("b", kvevents.TierGPU, k[:12])
	x.Store("c", kvevents.TierCPU, k)
	es := engines(4)
	es[3].Healthy = false
	_, err := registry.NewPolicy("weighted-prefix-placeholder", 1, x)
	if err == nil {
		t.Fatal("unknown policy accepted")
	}
	cfg := registry.DefaultConfig()
	cfg.Policy = "weighted"
	if err := cfg.SetParams("weighted", scheduler.WeightedConfig{{Name: "prefix", Weight: 1}}); err != nil {
		t.Fatal(err)
	}
	s, err := registry.New(cfg, x, nil)
	if err != nil {
		t.Fatal(err)
	}
	req := &scheduler.Request{Keys: k, BlockSize: 16, PromptTokens: 16 * 16, Model: "m"}
	var d scheduler.Decision
	if err := s.Schedule(req, es, &d); err != nil {
		t.Fatal(err)
	}
	// c: 16 CPU blocks × 0.8 = 12.8 > b: 12 GPU blocks.
	if d.Engine != "c" || len(d.Ranked) != 3 || d.Ranked[1].Engine != "b" || d.Filtered != 1 {
		t.Fatalf("decision %+v", d)
	}
	if d.Ranked[0].Match.CPU != 16 || d.Ranked[1].Match.GPU != 12 {
		t.Fatalf("matches %+v", d.Ranked)
	}
	for _, e := range es {
		e.Healthy = false
	}
	es2 := engines(2)
	es2[0].Model, es2[1].Model = "x", "y"
	if err := s.Schedule(req, es2, &d); !errors.Is(err, scheduler.ErrNoCandidates) {
		t.Fatalf("want ErrNoCandidates, got %v", err)
	}
}

func TestEveryPolicyBuildsAndPicks(t *testing.T) {
	x := newIdx(t)
	for _, name := range registry.PolicyNames() {
		cfg := registry.DefaultConfig()
		cfg.Policy = name
		if name == "weighted" {
			if err := cfg.SetParams("weighted", scheduler.WeightedConfig{{Name: "load", Weight: 1}}); err != nil {
				t.Fatal(err)
			}
		}
		s, err := registry.New(cfg, x, nil)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if s.Policy() != name {
			t.Fatalf("built %s for %s", s.Policy(), name)
		}
		var d scheduler.Decision
		req := &scheduler.Request{Keys: keys(4, 5), BlockSize: 16, PromptTokens: 70, Now: time.Unix(0, 0)}
		if err := s.Schedule(req, engines(5), &d); err != nil || d.Engine == "" || len(d.Ranked) != 5 {
			t.Fatalf("%s: %v %+v", name, err, d)
		}
	}
}

func BenchmarkSchedule(b *testing.B) {
	x := newIdx(b)
	k := keys(256, 1)
	es := engines(16)
	for i := range es {
		x.Store(es[i].ID, kvevents.TierGPU, k[:i*16])
	}
	// Typical: the request's chain held by two engines (whole and half),
	// the other 14 holding other prefixes.
	y := newIdx(b)
	y.Store(es[3].ID, kvevents.TierGPU, k)
	y.Store(es[9].ID, kvevents.TierGPU, k[:128])
	for i := range es {
		y.Store(es[i].ID, kvevents.TierGPU, keys(256, uint64(i)+100))
	}
	for _, c := range []struct {
		name string
		idx  *index.Index
	}{{"16-depths", x}, {"2-holders", y}} {
		for _, name := range []string{"random", "kvmesh", "kvmesh-learned", "kvmesh-learning", "llmd"} {
			b.Run(c.name+"/"+name, func(b *testing.B) {
				s, lr := benchPolicy(b, name, c.idx, es)
				req := &scheduler.Request{Keys: k, BlockSize: 16, PromptTokens: 4096}
				var d scheduler.Decision
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					if lr != nil { // kvmesh-learning: a first token between every two decisions
						i++
						lr.ObservePrefill(es[i%len(es)].ID, 2000, 300*time.Millisecond)
					}
					_ = s.Schedule(req, es, &d)
				}
			})
		}
	}
}

// benchPolicy is the named policy's scheduler; "kvmesh-learned" is the
// kvmesh policy priced by an online learner that has samples of every
// engine, as the ingress runs it (ingress/wiring.go learnedKVMesh), and
// "kvmesh-learning" the same with its learner returned, to be fed a sample
// between decisions (nil otherwise).
func benchPolicy(b *testing.B, name string, idx *index.Index, es []scheduler.Engine) (*scheduler.Scheduler, *learn.Learner) {
	b.Helper()
	if name != "kvmesh-learned" && name != "kvmesh-learning" {
		s, err := registry.NewPolicy(name, 1, idx)
		if err != nil {
			b.Fatal(err)
		}
		return s, nil
	}
	lr, err := learn.New(learn.Config{})
	if err != nil {
		b.Fatal(err)
	}
	for i, e := range es {
		for j := range 8 {
			lr.ObservePrefill(e.ID, 1000+500*j, time.Duration(100+10*i+50*j)*time.Millisecond)
			lr.ObserveDecode(e.ID, float64(1+j), float64(4000*(j+1)), time.Duration(20+j)*time.Millisecond, 10)
		}
	}
	cfg := registry.DefaultConfig()
	cfg.Policy, cfg.Seed = "kvmesh", 1
	pol, err := registry.Policy(&cfg)
	if err != nil {
		b.Fatal(err)
	}
	k := pol.(policies.KVMesh)
	k.Costs = lr
	s, err := scheduler.New(nil, k, idx, scheduler.Options{TierWeights: cfg.Weights(), Seed: 1})
	if err != nil {
		b.Fatal(err)
	}
	if name == "kvmesh-learning" {
		return s, lr
	}
	return s, nil
}

func TestSchedulerMetrics(t *testing.T) {
	x := newIdx(t)
	k := keys(8, 1)
	x.Store("a", kvevents.TierGPU, k)
	s, err := registry.NewPolicy("kvmesh", 1, x)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewPedanticRegistry()
	if err := s.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	var d scheduler.Decision
	es := engines(2)
	es[1].Healthy = false
	if err := s.Schedule(&scheduler.Request{Keys: k, BlockSize: 16, PromptTokens: 128}, es, &d); err != nil {
		t.Fatal(err)
	}
	mfs, _ := reg.Gather()
	got := map[string]float64{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
	}
	if got["kvmesh_scheduler_decisions_total"] != 1 || got["kvmesh_scheduler_filtered_engines_total"] != 1 ||
		got["kvmesh_scheduler_matched_blocks_total"] != 8 || got["kvmesh_scheduler_request_blocks_total"] != 8 ||
		got["kvmesh_scheduler_offered_blocks_total"] != 8 {
		t.Fatalf("metrics %v", got)
	}

	// A cache-blind policy sends the request to the idle engine: the
	// 8 blocks engine a holds were offered, none taken.
	lr, err := registry.NewPolicy("least-request", 1, x)
	if err != nil {
		t.Fatal(err)
	}
	reg = prometheus.NewPedanticRegistry()
	if err := lr.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	es = engines(2)
	es[0].InFlight = 5
	if err := lr.Schedule(&scheduler.Request{Keys: k, BlockSize: 16, PromptTokens: 128}, es, &d); err != nil || d.Engine != "b" {
		t.Fatalf("least-request chose %q (%v), want the idle b", d.Engine, err)
	}
	mfs, _ = reg.Gather()
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetCounter().GetValue()
	}
	if got["kvmesh_scheduler_matched_blocks_total"] != 0 || got["kvmesh_scheduler_offered_blocks_total"] != 8 {
		t.Fatalf("least-request metrics %v: want 0 matched of 8 offered", got)
	}
}
