package gossip

import (
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Two sidecars gossiping one engine id, and two engine ids gossiped with
// one URL (different --engine-id for one engine), are shown to operators:
// Duplicates lists them, two gauges count them, and a warning names them
// once they lasted dupWarnAfter, again only after dupWarnEvery; a sidecar
// warns only about its own engines. Before, the ingress saw one engine (or
// two healthy engines with one URL, routing two shares to it) and nothing
// said so. The broadcast loops are off (push/pull carries the state): the
// test runs each check at the time it chooses.
func TestDuplicateEnginesAndURLsCountedAndWarned(t *testing.T) {
	cfg := func(name, role string, join ...string) Config {
		c := testConfig(name, role, nil, join...)
		c.BroadcastInterval = time.Hour
		return c
	}
	reg := prometheus.NewRegistry()
	logs, aLogs := &records{level: slog.LevelWarn}, &records{level: slog.LevelWarn}
	ic := cfg("ingress-1", RoleIngress)
	ic.Registerer, ic.Logger = reg, slog.New(logs)
	in := start(t, ic)
	ac := cfg("sidecar-a", RoleSidecar, in.Addr())
	ac.Logger = slog.New(aLogs)
	a := start(t, ac)
	b := start(t, cfg("sidecar-b", RoleSidecar, in.Addr()))
	c := start(t, cfg("sidecar-c", RoleSidecar, in.Addr()))
	d := start(t, cfg("sidecar-d", RoleSidecar, in.Addr()))
	a.SetEngine(EngineState{ID: "e1", Model: "m", URL: "http://10.0.0.1:8000"})
	b.SetEngine(EngineState{ID: "e1", Model: "m", URL: "http://10.0.0.1:8000"}) // same engine, two sidecars
	c.SetEngine(EngineState{ID: "e2", Model: "m", URL: "http://10.0.0.2:8000"})
	d.SetEngine(EngineState{ID: "e3", Model: "m", URL: "http://10.0.0.2:8000/"}) // same engine, another id
	want := Duplicates{
		Engines: map[string][]string{"e1": {"sidecar-a", "sidecar-b"}},
		URLs:    map[string][]string{"http://10.0.0.2:8000": {"e2", "e3"}},
	}
	same := func(got Duplicates) bool {
		return maps.EqualFunc(got.Engines, want.Engines, slices.Equal[[]string]) && maps.EqualFunc(got.URLs, want.URLs, slices.Equal[[]string])
	}
	testutil.WaitFor(t, 20*time.Second, "the ingress and sidecar-a to hold every engine", func() bool {
		return same(in.Duplicates()) && len(a.Duplicates().Engines) == 1 && len(a.Duplicates().URLs) == 1
	})
	for name, v := range map[string]float64{"kvmesh_gossip_engines_multiple_sidecars": 1, "kvmesh_gossip_engine_urls_shared": 1} {
		if got := gaugeValue(t, reg, name); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}

	warnings := func(r *records) (engines, urls int) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, rec := range r.recs {
			switch rec.Message {
			case "engine gossiped by several sidecars: two sidecars for one engine (beyond a restart's overlap); the index follows one of them":
				engines++
			case "engine URL gossiped under several engine ids: sidecars with different --engine-id for one engine, which gets a share of the load for each":
				urls++
			}
		}
		return engines, urls
	}
	t0 := time.Now()
	for _, at := range []time.Duration{0, dupWarnAfter - time.Second} { // a restart's overlap, a rename
		in.checkDuplicates(t0.Add(at))
		a.checkDuplicates(t0.Add(at))
	}
	if e, u := warnings(logs); e+u != 0 {
		t.Fatalf("%d+%d warnings before the duplicates lasted %v", e, u, dupWarnAfter)
	}
	for _, at := range []time.Duration{dupWarnAfter, dupWarnAfter + time.Minute} {
		in.checkDuplicates(t0.Add(at))
		a.checkDuplicates(t0.Add(at))
	}
	if e, u := warnings(logs); e != 1 || u != 1 {
		t.Fatalf("the ingress warned %d times of the engine and %d of the URL, want once each", e, u)
	}
	if e, u := warnings(aLogs); e != 1 || u != 0 {
		t.Fatalf("sidecar-a warned %d times of its engine and %d of others' URL, want 1 and 0", e, u)
	}
	in.checkDuplicates(t0.Add(dupWarnAfter + dupWarnEvery))
	if e, u := warnings(logs); e != 2 || u != 2 {
		t.Fatalf("after %v the ingress warned %d and %d times in all, want twice each", dupWarnEvery, e, u)
	}

	// The second sidecar leaves: the engine is single again.
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "sidecar-b's engine gone from the ingress", func() bool {
		return len(in.Duplicates().Engines) == 0
	})
	if got := gaugeValue(t, reg, "kvmesh_gossip_engines_multiple_sidecars"); got != 0 {
		t.Errorf("kvmesh_gossip_engines_multiple_sidecars = %v after sidecar-b left, want 0", got)
	}
}

func gaugeValue(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return sumGauge(mf.GetMetric())
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func sumGauge(ms []*dto.Metric) float64 {
	var v float64
	for _, m := range ms {
		v += m.GetGauge().GetValue()
	}
	return v
}
