package ingress

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
)

func TestValidateListsEveryProblem(t *testing.T) {
	cfg := DefaultConfig()
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults invalid: %v", err)
	}
	cfg.Listen = "nope"
	cfg.MaxAttempts = 0
	cfg.ChatMode = "both"
	cfg.SendTimeout = -time.Second
	cfg.Engines = []StaticEngine{{ID: "a", Model: "m", URL: "ftp://x"}, {ID: "a", Model: "", URL: "http://h:1"}}
	cfg.Cluster.GossipSeeds = []string{"h:1"}
	cfg.Scheduler.Policy = "nonesuch"
	err := cfg.Validate()
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err %v", err)
	}
	for _, want := range []string{"listen", "max attempts", "chat mode", "send timeout", "url", "duplicate id", "empty model", "gossip seeds", "scheduler"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

// A static engine's URL is the engine's base: the ingress appends /v1/...
// to it. An OpenAI base URL pasted there (http://h:p/v1) was accepted and
// every request then 404ed on /v1/v1/...; a lone trailing slash is fine
// and dropped.
func TestStaticEngineURLEndingInV1Refused(t *testing.T) {
	for _, u := range []string{"http://h:1/v1", "http://h:1/v1/", "http://h:1/openai/v1", "https://h:1/x?y=1", "http://h:1#f"} {
		cfg := DefaultConfig()
		cfg.Engines = []StaticEngine{{ID: "a", Model: "m", URL: u}}
		if err := cfg.Validate(); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "without /v1") || !strings.Contains(err.Error(), u) {
			t.Errorf("url %q: %v, want it refused", u, err)
		}
	}
	// A trailing slash is dropped; a path prefix (a path-routing proxy in
	// front of the engine) is kept, since requests are built as url + path.
	for u, want := range map[string]string{
		"http://h:1/":             "http://h:1",
		"http://gw:80/engines/a":  "http://gw:80/engines/a",
		"http://gw:80/engines/a/": "http://gw:80/engines/a",
		"http://gw:80/v1x":        "http://gw:80/v1x",
	} {
		cfg := DefaultConfig()
		cfg.Engines = []StaticEngine{{ID: "a", Model: "m", URL: u}}
		if err := cfg.Validate(); err != nil {
			t.Errorf("url %q: %v", u, err)
			continue
		}
		if got := newStaticMembership(cfg.Engines).Engines(nil)[0].URL; got != want {
			t.Errorf("url %q: engine URL %q, want %q", u, got, want)
		}
	}
}

func TestLoadConfigFile(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "ingress.yaml")
	os.WriteFile(good, []byte("listen: 127.0.0.1:9000\nidleTimeout: 45s\nengines:\n  - {id: e, model: m, url: \"http://127.0.0.1:1\"}\nscheduler: {policy: random}\ncluster: {gossipBind: \"127.0.0.1:0\", natsURLs: [\"nats://127.0.0.1:4222\"]}\n"), 0o644)
	cfg, err := LoadConfigFile(good)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != "127.0.0.1:9000" || cfg.IdleTimeout != 45*time.Second || cfg.Scheduler.Policy != "random" ||
		len(cfg.Engines) != 1 || cfg.Cluster.NATSURLs[0] != "nats://127.0.0.1:4222" || cfg.MaxAttempts != DefaultConfig().MaxAttempts {
		t.Fatalf("%+v", cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte("listen: x\nunknownField: 1\n"), 0o644)
	if _, err := LoadConfigFile(bad); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "unknownField") {
		t.Fatalf("unknown field: %v", err)
	}
}

// TestIndexConfigReachesTheIndex checks that speculativeTTL and exactLookup
// configure the index the ingress builds: a speculative entry outlives the
// configured TTL by nothing, and an exact index stops at a hole the search
// looks past.
func TestIndexConfigReachesTheIndex(t *testing.T) {
	cfg := DefaultConfig()
	cfg.SpeculativeTTL = 50 * time.Millisecond
	cfg.ExactLookup = true
	var deps Deps
	if _, err := defaultScheduler(&cfg, &deps); err != nil {
		t.Fatal(err)
	}
	idx := deps.Index
	now := time.Unix(1000, 0)
	keys := []uint64{11, 12, 13, 14}
	idx.AddSpeculative("a", keys, now)
	idx.ExpireSpeculative(now.Add(49 * time.Millisecond))
	if es := idx.Engines(); len(es) != 1 || es[0].Speculative != 4 {
		t.Fatalf("before the TTL: %+v", es)
	}
	idx.ExpireSpeculative(now.Add(50 * time.Millisecond))
	if es := idx.Engines(); es[0].Speculative != 0 {
		t.Fatalf("after the configured 50ms TTL: %+v", es)
	}
	idx.Store("a", kvevents.TierGPU, keys)
	idx.Remove("a", kvevents.TierGPU, keys[1:2])
	var res index.Result
	idx.Lookup(keys, &res)
	s, _ := idx.Slot("a")
	if got := res.Get(s).GPU; got != 1 {
		t.Fatalf("exact lookup depth %d, want 1 (stopped at the hole)", got)
	}
}

// TestReplicasDrawTheirOwnRandomStream checks that ingress replicas with the
// same scheduler config do not make the same random choices: the random
// policy's picks on two replica ids differ, while one id repeats its own.
func TestReplicasDrawTheirOwnRandomStream(t *testing.T) {
	engines := make([]scheduler.Engine, 8)
	for i := range engines {
		engines[i] = scheduler.Engine{ID: fmt.Sprintf("e%d", i), Healthy: true, Model: "m"}
	}
	picks := func(id string) []string {
		cfg := DefaultConfig()
		cfg.ID = id
		cfg.Scheduler.Policy = "random"
		var deps Deps
		s, err := defaultScheduler(&cfg, &deps)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		var d scheduler.Decision
		for range 64 {
			if err := s.Schedule(&scheduler.Request{Model: "m", Keys: []uint64{1, 2}}, engines, &d); err != nil {
				t.Fatal(err)
			}
			out = append(out, d.Engine)
		}
		return out
	}
	a, a2, b := picks("ingress-a"), picks("ingress-a"), picks("ingress-b")
	if !slices.Equal(a, a2) {
		t.Fatalf("one replica id gave two streams:\n%v\n%v", a, a2)
	}
	same := 0
	for i := range a {
		if a[i] == b[i] {
			same++
		}
	}
	// Independent picks among 8 engines agree about 64/8 = 8 times; the
	// same stream agrees 64 times.
	if same > 24 {
		t.Fatalf("replicas ingress-a and ingress-b agreed on %d of %d random picks:\n%v\n%v", same, len(a), a, b)
	}
}

// TestListenAddrsChecked: a listen or admin address whose port is out of
// range or not a number, or whose host is no address, is a configuration
// problem naming its flag, both listed at once; it failed at the bind,
// one at a time.
func TestListenAddrsChecked(t *testing.T) {
	for _, c := range []struct{ listen, admin string }{
		{"127.0.0.1:70000", "127.0.0.1:99999"},
		{"127.0.0.1:abc", "127.0.0.1:-1"},
		{"999.1.1.1:27010", "bad host:1"},
		{"127.0.0.1:+80", "127.0.0.1"},
	} {
		cfg := DefaultConfig()
		cfg.Listen, cfg.AdminListen = c.listen, c.admin
		err := cfg.Validate()
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "(--listen, listen) "+strconv.Quote(c.listen)) ||
			!strings.Contains(err.Error(), "(--admin, adminListen) "+strconv.Quote(c.admin)) {
			t.Errorf("listen %q, admin %q: %v; want both named", c.listen, c.admin, err)
		}
	}
	for _, ok := range []string{"127.0.0.1:0", ":8000", "[::1]:0", "[fe80::1%eth0]:80", "0.0.0.0:65535", "localhost:8000", "ingress-0.kvmesh.svc.cluster.local.:9000", "my_host:1"} {
		cfg := DefaultConfig()
		cfg.Listen, cfg.AdminListen = ok, ok
		if err := cfg.Validate(); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
}
