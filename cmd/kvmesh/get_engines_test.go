package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"math"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/learn/learntest"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
)

// startEngine runs a simulator and its sidecar in this process, gossiping
// on loopback; seed "" starts the cluster. Both stop with the test.
func startEngine(t *testing.T, nats *natsutil.Embedded, id, role, seed string) *sidecar.Sidecar {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cfg := sim.Config{Model: "m", HTTPAddr: "127.0.0.1:0", KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
		TimeScale: 1, Seed: 1, Logger: log}
	if role == "decode" { // serves two LoRA adapters, which its sidecar gossips
		cfg.LoRA = sim.LoRAConfig{Enable: true, Modules: map[string]string{"sql-lora": "/a/sql", "chat-lora": "/a/chat"}, MaxLoRAs: 2}
	}
	s, err := sim.Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	sc := sidecar.DefaultConfig()
	sc.Engines = []sidecar.EngineConfig{{ID: id, Model: "m", URL: s.URL(), Role: role, PDGroup: "g1", Events: s.EventsEndpoint(0), Replay: s.ReplayEndpoint(0), BlockSize: 16}}
	sc.NATS = natsutil.DefaultConfig()
	sc.NATS.URLs, sc.NATS.Name = []string{nats.URL()}, "sidecar-"+id
	g := gossip.DefaultConfig()
	g.Name, g.Profile, g.Meta = "sidecar-"+id, "local", gossip.NodeMeta{Role: gossip.RoleSidecar, ID: id}
	if seed != "" {
		g.Join = []string{seed}
	}
	sc.Gossip, sc.Logger, sc.Registerer = &g, log, prometheus.NewRegistry()
	sc.ScrapeInterval = 100 * time.Millisecond
	car, err := sidecar.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- car.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		_ = car.Close()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("sidecar %s: %v", id, err)
		}
		_ = s.Close()
	})
	testutil.WaitFor(t, 30*time.Second, "sidecar "+id+" ready", func() bool { return car.Ready() && car.Gossip() != nil })
	return car
}

// TestGetEngines: `kvmesh get engines` joins the gossip of a real mesh
// (two simulators with sidecars, prefill and decode) and lists both with
// their roles; `describe engine` shows one; a missing engine is an error.
func TestGetEngines(t *testing.T) {
	nats := testutil.NATS(t)
	p := startEngine(t, nats, "eng-prefill-0", "prefill", "")
	seed := p.Gossip().Addr()
	d := startEngine(t, nats, "eng-decode-0", "decode", seed)
	// Both sidecars' views, the seed's included: the observer joins the
	// seed and takes its view, which may lag the decode sidecar's own.
	testutil.WaitFor(t, 30*time.Second, "both engines ready in the gossip", func() bool {
		for _, c := range []*sidecar.Sidecar{p, d} {
			e1, ok1 := c.Gossip().Engine("eng-prefill-0")
			e2, ok2 := c.Gossip().Engine("eng-decode-0")
			if !ok1 || !ok2 || !e1.Ready || !e2.Ready || e2.LoRAs == "" {
				return false
			}
		}
		return true
	})
	// An ingress-like member shares what its learner measured of the
	// prefill engine: 8,000 tokens/s.
	g := gossip.DefaultConfig()
	g.Name, g.Profile, g.BindAddr, g.BindPort, g.Join = "ingress-1", "local", "127.0.0.1", 0, []string{seed}
	g.Meta, g.Logger = gossip.NodeMeta{Role: gossip.RoleIngress, ID: "ingress-1"}, slog.New(slog.NewTextHandler(io.Discard, nil))
	ing, err := gossip.New(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ing.Close() })
	share, err := learntest.Share("eng-prefill-0", 8000)
	if err != nil {
		t.Fatal(err)
	}
	if err := ing.SetAppState(learn.StateName, share); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the share reaches the seed", func() bool { return len(p.Gossip().AppStates(learn.StateName)) == 1 })

	var out, errb strings.Builder
	if code := run([]string{"get", "engines", "--join", seed, "--wait", "30s"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "NAME") {
		t.Fatalf("want a header and two engines:\n%s", out.String())
	}
	for _, c := range []string{"MODEL", "ROLE", "GROUP", "READY", "RUNNING", "WAITING", "KV%", "BLOCKS", "NODES", "AGE", "PREFILL TOK/S"} {
		if !strings.Contains(lines[0], c) {
			t.Errorf("header lacks %s: %s", c, lines[0])
		}
	}
	want := map[string]string{"eng-decode-0": "decode", "eng-prefill-0": "prefill"}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		if len(f) != 12 || want[f[0]] != f[2] || f[1] != "m" || f[3] != "g1" || f[4] != "true" || f[9] != "sidecar-"+f[0] {
			t.Errorf("row %q", l)
			continue
		}
		rate, err := strconv.ParseFloat(f[11], 64)
		switch {
		case f[0] == "eng-decode-0" && f[11] != "-":
			t.Errorf("decode engine, which no ingress measured: learned %q, want -", f[11])
		case f[0] == "eng-prefill-0" && (err != nil || math.Abs(rate/8000-1) > 0.05):
			t.Errorf("prefill engine: learned %q tokens/s, want within 5 %% of 8000", f[11])
		}
		delete(want, f[0])
	}
	if len(want) > 0 {
		t.Errorf("not listed: %v", want)
	}

	out.Reset()
	if code := run([]string{"describe", "engine", "eng-decode-0", "--join", seed, "--wait", "30s"}, &out, &errb); code != 0 {
		t.Fatalf("describe: exit %d: %s", code, errb.String())
	}
	for _, s := range []string{"Name:            eng-decode-0", "Role:            decode", "P/D group:       g1", "Block size:      16", "gpu    0 blocks (digest sum 0 xor 0)",
		"Learned costs:   none yet", "LoRA adapters:   chat-lora, sql-lora"} {
		if !strings.Contains(out.String(), s) {
			t.Errorf("describe lacks %q:\n%s", s, out.String())
		}
	}
	out.Reset()
	if code := run([]string{"describe", "engine", "eng-prefill-0", "--join", seed, "--wait", "30s"}, &out, &errb); code != 0 ||
		!strings.Contains(out.String(), "Learned costs:   prefill ") || !strings.Contains(out.String(), "(ingresses sharing: 1)") {
		t.Errorf("describe the measured engine: exit %d:\n%s", code, out.String())
	}
	errb.Reset()
	if code := run([]string{"describe", "engine", "nope", "--join", seed, "--wait", "500ms"}, io.Discard, &errb); code != 1 || !strings.Contains(errb.String(), `engine "nope" not in the mesh`) {
		t.Errorf("missing engine: exit %d, %s", code, errb.String())
	}
	if code := run([]string{"get", "engines"}, io.Discard, io.Discard); code != 2 {
		t.Errorf("get engines without --join: exit %d, want 2", code)
	}
}

// TestGetEnginesIPv6: the observer's --gossip-bind and --gossip-advertise
// are read as every member's are (gossip.Config.SetAddrs), IPv6 included.
func TestGetEnginesIPv6(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = ln.Close()
	}
	g := gossip.DefaultConfig()
	if err := g.SetAddrs("[::1]:0", ""); err != nil {
		t.Fatal(err)
	}
	g.Name, g.Profile, g.Logger = "sidecar-v6", "local", slog.New(slog.NewTextHandler(io.Discard, nil))
	g.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "eng-v6"}
	sc, err := gossip.New(g)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sc.Close() })
	sc.SetEngine(gossip.EngineState{ID: "eng-v6", Model: "m", Ready: true})

	var out, errb strings.Builder
	if code := run([]string{"get", "engines", "--join", sc.Addr(), "--gossip-bind", "[::1]:0", "--gossip-advertise", "::1", "--wait", "30s"}, &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "eng-v6 ") {
		t.Fatalf("want a header and eng-v6:\n%s", out.String())
	}
	// Without --gossip-bind the observer listens on [::1] (observerBind).
	out.Reset()
	errb.Reset()
	if code := run([]string{"get", "engines", "--join", sc.Addr(), "--wait", "30s"}, &out, &errb); code != 0 {
		t.Fatalf("default bind: exit %d: %s", code, errb.String())
	}
	if lines := strings.Split(strings.TrimSpace(out.String()), "\n"); len(lines) != 2 || !strings.HasPrefix(lines[1], "eng-v6 ") {
		t.Fatalf("default bind: want a header and eng-v6:\n%s", out.String())
	}
	errb.Reset()
	if code := run([]string{"get", "engines", "--join", sc.Addr(), "--gossip-bind", "nope"}, io.Discard, &errb); code != 2 ||
		!strings.Contains(errb.String(), `gossip bind "nope": want host:port`) {
		t.Errorf("bad --gossip-bind: exit %d, %s", code, errb.String())
	}
}

// TestGetEnginesSeedsNeedAPort: a --join seed without a port is refused
// (memberlist dials it at the observer's own port: it joined itself and
// printed an empty table with exit 0), and a join that reaches only the
// observer itself is an error, exit 1 (tester h-ipv6 F4).
func TestGetEnginesSeedsNeedAPort(t *testing.T) {
	for _, seed := range []string{"[::1]", "::1", "127.0.0.1", "127.0.0.1:1,localhost"} {
		var out, errb strings.Builder
		code := run([]string{"get", "engines", "--join", seed, "--wait", "0"}, &out, &errb)
		if code != 2 || !strings.Contains(errb.String(), "want host:port") || out.Len() != 0 {
			t.Errorf("--join %s: exit %d, stdout %q, stderr %s; want exit 2 asking for host:port", seed, code, out.String(), errb.String())
		}
	}
	// The observer's own address as the seed: no member of any mesh answers.
	for try := 0; ; try++ {
		port := freeGossipPort(t)
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		var out, errb strings.Builder
		code := run([]string{"get", "engines", "--join", addr, "--gossip-bind", addr, "--wait", "0"}, &out, &errb)
		if code != 0 && strings.Contains(errb.String(), "address already in use") && try < 5 {
			continue // the port was taken between the check and the bind
		}
		if code != 1 || !strings.Contains(errb.String(), "the seeds reached only this observer") || out.Len() != 0 {
			t.Errorf("observer joining itself: exit %d, stdout %q, stderr %s; want exit 1", code, out.String(), errb.String())
		}
		break
	}
}

// freeGossipPort is a port free on 127.0.0.1 for TCP and UDP when asked.
func freeGossipPort(t *testing.T) int {
	t.Helper()
	for {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		_ = ln.Close()
		if err == nil {
			_ = pc.Close()
			return port
		}
	}
}

// TestObserverBindFollowsTheSeeds: without --gossip-bind the observer
// listens on the address that reaches its first seed, in the seed's
// family: bound to 127.0.0.1, every member of an IPv6 mesh logged
// "network is unreachable" for its probes (tester h-ipv6 F3).
func TestObserverBindFollowsTheSeeds(t *testing.T) {
	if got := observerBind([]string{"127.0.0.1:7946"}); got != "127.0.0.1:0" {
		t.Errorf("IPv4 loopback seed: bind %s, want 127.0.0.1:0", got)
	}
	if got := observerBind(nil); got != "127.0.0.1:0" {
		t.Errorf("no seed: bind %s, want 127.0.0.1:0", got)
	}
	if ln, err := net.ListenPacket("udp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = ln.Close()
	}
	if got := observerBind([]string{"[::1]:7946", "127.0.0.1:7946"}); got != "[::1]:0" {
		t.Errorf("IPv6 loopback seed: bind %s, want [::1]:0", got)
	}
}

func TestEngineResource(t *testing.T) {
	for args, want := range map[string]bool{
		"engines":                              true,
		"--gossip-advertise 10.0.0.1 engines":  true,
		"--join 1.2.3.4:7946 engines":          true,
		"-join=x engine e1":                    true,
		"--namespace engines modeldeployments": false,
		"modeldeployments":                     false,
		"--kubeconfig k rolescalers":           false,
		"":                                     false,
	} {
		if got := engineResource(strings.Fields(args)); got != want {
			t.Errorf("%q: %v, want %v", args, got, want)
		}
	}
}

// TestEverySidecarSeen: the view is settled only when each sidecar member
// gossips an engine; ingresses and orchestrators gossip none.
func TestEverySidecarSeen(t *testing.T) {
	members := map[string]gossip.NodeMeta{"sidecar-a": {Role: gossip.RoleSidecar}, "sidecar-b": {Role: gossip.RoleSidecar},
		"ingress-1": {Role: gossip.RoleIngress}}
	a := gossip.EngineView{EngineState: gossip.EngineState{ID: "a"}, Node: "sidecar-a"}
	b := gossip.EngineView{EngineState: gossip.EngineState{ID: "b"}, Node: "sidecar-b"}
	if everySidecarSeen(members, []gossip.EngineView{a}, gossip.Duplicates{}) {
		t.Error("sidecar-b's engine missing, yet settled")
	}
	if !everySidecarSeen(members, []gossip.EngineView{a, b}, gossip.Duplicates{}) {
		t.Error("every sidecar seen, yet not settled")
	}
	// sidecar-b gossips engine a too: its state is not the one shown.
	if !everySidecarSeen(members, []gossip.EngineView{a}, gossip.Duplicates{Engines: map[string][]string{"a": {"sidecar-a", "sidecar-b"}}}) {
		t.Error("sidecar-b gossips engine a, yet not settled")
	}
}

// TestGetEnginesShowsDuplicates: an engine two sidecars gossip lists both
// under NODES and in describe, and engines sharing one URL are named in
// describe and in a warning under the table. Before, get engines showed
// one node and nothing of a shared URL.
func TestGetEnginesShowsDuplicates(t *testing.T) {
	now := time.Now()
	view := func(id, url, node string) gossip.EngineView {
		return gossip.EngineView{EngineState: gossip.EngineState{ID: id, Model: "m", URL: url}, Node: node, Updated: now}
	}
	es := []gossip.EngineView{view("e1", "http://10.0.0.1:8000", "sidecar-b"), view("e2", "http://10.0.0.2:8000", "sidecar-c"), view("e3", "http://10.0.0.2:8000/", "sidecar-d")}
	dups := gossip.Duplicates{
		Engines: map[string][]string{"e1": {"sidecar-a", "sidecar-b"}},
		URLs:    map[string][]string{"http://10.0.0.2:8000": {"e2", "e3"}},
	}
	var out, warn strings.Builder
	lr, _ := learn.FromShares(nil)
	if err := writeEngines(&out, es, dups, lr, now); err != nil {
		t.Fatal(err)
	}
	writeDuplicates(&warn, es, dups)
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if f := strings.Fields(lines[1]); len(f) != 12 || f[9] != "sidecar-b,sidecar-a" {
		t.Errorf("e1's row %q, want NODES sidecar-b,sidecar-a (the shown state's node first)", lines[1])
	}
	if f := strings.Fields(lines[2]); len(f) != 12 || f[9] != "sidecar-c" {
		t.Errorf("e2's row %q", lines[2])
	}
	for _, s := range []string{"warning: engine e1 is gossiped by 2 sidecars (sidecar-b, sidecar-a)", "warning: engines e2, e3 share the URL http://10.0.0.2:8000"} {
		if !strings.Contains(warn.String(), s) {
			t.Errorf("warnings lack %q:\n%s", s, warn.String())
		}
	}
	if n := strings.Count(warn.String(), "\n"); n != 2 {
		t.Errorf("%d warning lines, want 2:\n%s", n, warn.String())
	}
	out.Reset()
	if err := describeEngine(&out, es[0], nil, dups, lr, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Other nodes:     sidecar-a") {
		t.Errorf("describe e1 lacks the second sidecar:\n%s", out.String())
	}
	out.Reset()
	if err := describeEngine(&out, es[2], nil, dups, lr, now); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "URL shared by:   e2") {
		t.Errorf("describe e3 lacks the engine sharing its URL:\n%s", out.String())
	}
}

// TestEngineAgeUnderSkew: AGE is the age gossip tells without comparing
// clocks, whatever the sidecar's clock dates the state; a state from a
// sidecar that predates it is aged on this host's clock, and one dated
// more than a second in this host's future is "?", not 0s. Before, AGE was
// now − Updated: 0s for a sidecar ahead, minutes for one behind (finding 6
// of the NATS/skew test).
func TestEngineAgeUnderSkew(t *testing.T) {
	now := time.Now()
	for _, c := range []struct {
		name    string
		updated time.Time
		age     time.Duration
		want    string
	}{
		{"known, sidecar 10 min ahead", now.Add(10 * time.Minute), 3 * time.Second, "3.0s"},
		{"known, sidecar 10 min behind", now.Add(-10 * time.Minute), 3 * time.Second, "3.0s"},
		{"known, long", now, 90 * time.Second, "1m30s"},
		{"unknown, dated in the past", now.Add(-42 * time.Second), -1, "42s"},
		{"unknown, dated within skew tolerance", now.Add(300 * time.Millisecond), -1, "0.0s"},
		{"unknown, dated in the future", now.Add(10 * time.Minute), -1, "?"},
	} {
		e := gossip.EngineView{EngineState: gossip.EngineState{ID: "e", Model: "m"}, Node: "sidecar-e", Updated: c.updated, Age: c.age}
		if got := engineAge(e, now); got != c.want {
			t.Errorf("%s: AGE %q, want %q", c.name, got, c.want)
		}
		var out strings.Builder
		lr, _ := learn.FromShares(nil)
		if err := describeEngine(&out, e, nil, gossip.Duplicates{}, lr, now); err != nil {
			t.Fatal(err)
		}
		want := "Updated:         " + c.want + " ago"
		if c.want == "?" {
			want = "Updated:         unknown (the sidecar dates it in this host's future"
		}
		if !strings.Contains(out.String(), want) {
			t.Errorf("%s: describe lacks %q:\n%s", c.name, want, out.String())
		}
	}
}

// TestDescribeEngineDecimal: describe prints the delta head's epoch and the
// digests in decimal, as /debug/state, /debug/index and kvmesh inspect stream
// do (docs/OPERATIONS.md): an epoch read in one compares with the others as
// is. It printed them in hex (epoch 36b82e991d5d7855 beside /debug/state's
// 3942952708920408149; tester h-docs2 F4).
func TestDescribeEngineDecimal(t *testing.T) {
	e := gossip.EngineView{EngineState: gossip.EngineState{ID: "e", Model: "m"}, Node: "sidecar-e", Updated: time.Now(), Age: time.Second}
	e.Digest.Head = kvevents.Head{Epoch: 3942952708920408149, Seq: 42}
	e.Digest.Digests[0] = kvevents.Digest{Count: 3, Sum: 18446744073709551615, Xor: 1234567890123456789}
	lr, _ := learn.FromShares(nil)
	var out strings.Builder
	if err := describeEngine(&out, e, nil, gossip.Duplicates{}, lr, time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"Delta head:      epoch 3942952708920408149 seq 42",
		"gpu    3 blocks (digest sum 18446744073709551615 xor 1234567890123456789)"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("describe lacks %q:\n%s", want, out.String())
		}
	}
}

// TestDescribeEngineRedactsURL: describe prints the engine URL's userinfo
// as "redacted", as /debug/engines does (docs/SECURITY.md): it printed the
// gossiped URL's password in clear (tester h-ipv6 F1).
func TestDescribeEngineRedactsURL(t *testing.T) {
	e := gossip.EngineView{EngineState: gossip.EngineState{ID: "[::1]:20010", Model: "m", URL: "http://user:secret@[::1]:20010"},
		Node: "sidecar-e", Updated: time.Now(), Age: time.Second}
	lr, _ := learn.FromShares(nil)
	var out strings.Builder
	if err := describeEngine(&out, e, nil, gossip.Duplicates{}, lr, time.Now()); err != nil {
		t.Fatal(err)
	}
	if s := out.String(); strings.Contains(s, "secret") || !strings.Contains(s, "URL:             http://redacted@[::1]:20010\n") {
		t.Errorf("describe shows the URL's userinfo, or no redacted URL:\n%s", s)
	}
}

// TestGetEnginesNegativeWait: a negative --wait is a usage error (it
// meant 0 silently); 0 is documented: what joining brought.
func TestGetEnginesNegativeWait(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"get", "engines", "--join", "127.0.0.1:1", "--wait", "-1s"}, &out, &errOut)
	if code != 2 || !strings.Contains(errOut.String(), "--wait -1s: want ≥ 0") {
		t.Fatalf("exit %d, stderr %q", code, errOut.String())
	}
}
