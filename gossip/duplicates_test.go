package gossip

import (
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Two sidecars gossiping one engine id with one URL, two engines under one
// id (two sidecars, different URLs), and two engine ids gossiped with one
// URL (different --engine-id for one engine, the URL spelled differently)
// are shown to operators: Duplicates lists them, gauges count them, and a
// report names them once they lasted dupWarnAfter, again only after
// dupWarnEvery; a sidecar reports only its own engines. Two engines under
// one id are an error of their own, with both URLs, not "two sidecars for
// one engine"; "for" is a duration's text, not nanoseconds. Before, the
// ingress saw one engine (or two healthy engines with one URL, routing two
// shares to it) and nothing said so. The broadcast loops are off
// (push/pull carries the state): the test runs each check at the time it
// chooses.
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
	e := start(t, cfg("sidecar-e", RoleSidecar, in.Addr()))
	f := start(t, cfg("sidecar-f", RoleSidecar, in.Addr()))
	a.SetEngine(EngineState{ID: "e1", Model: "m", URL: "http://10.0.0.1:8000"})
	b.SetEngine(EngineState{ID: "e1", Model: "m", URL: "http://10.0.0.1:8000"}) // same engine, two sidecars
	c.SetEngine(EngineState{ID: "e2", Model: "m", URL: "http://10.0.0.2:8000"})
	d.SetEngine(EngineState{ID: "e3", Model: "m", URL: "HTTP://10.0.0.2:8000/"}) // same engine, another id and spelling
	e.SetEngine(EngineState{ID: "e4", Model: "m", URL: "http://10.0.0.4:8000"})
	f.SetEngine(EngineState{ID: "e4", Model: "m", URL: "http://10.0.0.5:8000"}) // another engine, same id
	want := Duplicates{
		Engines:   map[string][]string{"e1": {"sidecar-a", "sidecar-b"}, "e4": {"sidecar-e", "sidecar-f"}},
		Conflicts: map[string][]string{"e4": {"http://10.0.0.4:8000", "http://10.0.0.5:8000"}},
		URLs:      map[string][]string{"http://10.0.0.2:8000": {"e2", "e3"}},
	}
	same := func(got Duplicates) bool {
		return maps.EqualFunc(got.Engines, want.Engines, slices.Equal[[]string]) && maps.EqualFunc(got.URLs, want.URLs, slices.Equal[[]string]) &&
			maps.EqualFunc(got.Conflicts, want.Conflicts, slices.Equal[[]string])
	}
	testutil.WaitFor(t, 20*time.Second, "the ingress and sidecar-a to hold every engine", func() bool {
		return same(in.Duplicates()) && len(a.Duplicates().Engines) == 2 && len(a.Duplicates().URLs) == 1
	})
	for name, v := range map[string]float64{"kvmesh_gossip_engines_multiple_sidecars": 2, "kvmesh_gossip_engine_ids_conflicting": 1, "kvmesh_gossip_engine_urls_shared": 1} {
		if got := testutil.MetricSum(t, reg, name); got != v {
			t.Errorf("%s = %v, want %v", name, got, v)
		}
	}

	warnings := func(r *records) (engines, urls int) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, rec := range r.recs {
			switch rec.Message {
			case msgDupSidecars:
				engines++
			case msgDupURL:
				urls++
			}
		}
		return engines, urls
	}
	conflicts := func(r *records) (n int) {
		r.mu.Lock()
		defer r.mu.Unlock()
		for _, rec := range r.recs {
			if rec.Message != msgDupEngines {
				continue
			}
			n++
			if rec.Level != slog.LevelError {
				t.Errorf("two engines under one id reported at %v, want ERROR", rec.Level)
			}
			attrs := map[string]slog.Value{}
			rec.Attrs(func(a slog.Attr) bool { attrs[a.Key] = a.Value; return true })
			if got := attrs["engine"].String(); got != "e4" {
				t.Errorf("engine = %q, want e4", got)
			}
			if got, _ := attrs["urls"].Any().([]string); !slices.Equal(got, want.Conflicts["e4"]) {
				t.Errorf("urls = %v, want %v", attrs["urls"].Any(), want.Conflicts["e4"])
			}
			if v := attrs["for"]; v.Kind() != slog.KindString || (v.String() != "30s" && v.String() != "1m30s") {
				t.Errorf("for = %v (%v), want a duration's text such as 30s", v, v.Kind())
			}
		}
		return n
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
	if n := conflicts(logs); n != 1 {
		t.Fatalf("the ingress reported two engines under one id %d times, want once", n)
	}
	if e, u := warnings(aLogs); e != 1 || u != 0 {
		t.Fatalf("sidecar-a warned %d times of its engine and %d of others' URL, want 1 and 0", e, u)
	}
	in.checkDuplicates(t0.Add(dupWarnAfter + dupWarnEvery))
	if e, u := warnings(logs); e != 2 || u != 2 {
		t.Fatalf("after %v the ingress warned %d and %d times in all, want twice each", dupWarnEvery, e, u)
	}

	// The second sidecar of each leaves: each engine is single again.
	for _, n := range []*Node{b, f} {
		if err := n.Close(); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 20*time.Second, "sidecar-b's and sidecar-f's engines gone from the ingress", func() bool {
		return len(in.Duplicates().Engines) == 0
	})
	for _, name := range []string{"kvmesh_gossip_engines_multiple_sidecars", "kvmesh_gossip_engine_ids_conflicting"} {
		if got := testutil.MetricSum(t, reg, name); got != 0 {
			t.Errorf("%s = %v after the second sidecars left, want 0", name, got)
		}
	}
}

// NormalURL compares URLs as the engine sees them: case of scheme and
// host, the default port, a trailing slash and an IP literal's spelling do
// not tell two engines apart; a host name and its address still do (no DNS).
func TestNormalURL(t *testing.T) {
	for in, want := range map[string]string{
		"http://10.0.0.1:8000":         "http://10.0.0.1:8000",
		"HTTP://Engine-1.NS.svc:8000/": "http://engine-1.ns.svc:8000",
		"http://10.0.0.1:80/":          "http://10.0.0.1",
		"https://10.0.0.1:443":         "https://10.0.0.1",
		"https://10.0.0.1:80":          "https://10.0.0.1:80",
		"http://[0:0::1]:8000/":        "http://[::1]:8000",
		"http://[::ffff:10.0.0.1]:80":  "http://10.0.0.1",
		"http://localhost:8000":        "http://localhost:8000",
		"http://10.0.0.1:8000/v1/":     "http://10.0.0.1:8000/v1",
		"not a url/":                   "not a url",
		"":                             "",
	} {
		if got := NormalURL(in); got != want {
			t.Errorf("NormalURL(%q) = %q, want %q", in, got, want)
		}
	}
}
