package sidecar

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// An engine URL that names this host only is gossiped to ingresses on
// other hosts, which dial themselves: the sidecar warns at start when its
// gossip address is not loopback too (a single-host mesh is fine).
func TestWarnsOfLocalEngineURL(t *testing.T) {
	for _, tc := range []struct {
		url, bind, advertise string
		warn                 bool
	}{
		{"http://127.0.0.1:8000", "0.0.0.0:7946", "", true},
		{"http://127.0.0.1:8000", "0.0.0.0:7946", "10.0.0.5", true},
		{"http://localhost:8000", "0.0.0.0:7946", "fd00::1", true},
		{"http://[::1]:8000", "[::]:7946", "", true},
		{"http://0.0.0.0:8000", "10.0.0.5:7946", "", true},
		{"http://[::]:8000", "10.0.0.5:7946", "", true},
		{"http://10.0.0.5:8000", "0.0.0.0:7946", "10.0.0.5", false},
		{"http://[fd00::1]:8000", "0.0.0.0:7946", "fd00::1", false},
		{"http://engine.example:8000", "0.0.0.0:7946", "", false},
		// Everything on one host (kvmesh demo, tests): loopback is right.
		{"http://127.0.0.1:8000", "127.0.0.1:0", "", false},
		{"http://127.0.0.1:8000", "0.0.0.0:7946", "127.0.0.1", false},
		{"http://[::1]:8000", "[::1]:7946", "", false},
	} {
		o := DefaultOptions()
		o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", tc.url, "tcp://127.0.0.1:5557"
		o.GossipBind, o.GossipAdvertise = tc.bind, tc.advertise
		var logs bytes.Buffer
		cfg, err := o.Build(slog.New(slog.NewTextHandler(&logs, nil)))
		if err != nil {
			t.Fatalf("%s %s %s: %v", tc.url, tc.bind, tc.advertise, err)
		}
		cfg.warnLocalEngineURLs(cfg.Logger)
		if got := strings.Contains(logs.String(), "engine URL names this host only"); got != tc.warn {
			t.Errorf("url %s, gossip bind %s advertise %q: warned %v, want %v: %s", tc.url, tc.bind, tc.advertise, got, tc.warn, logs.String())
		}
	}
	// The warning names the URL without its credentials (h-ipv6 F1).
	o := DefaultOptions()
	o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://user:s3cret@127.0.0.1:8000", "tcp://127.0.0.1:5557"
	o.GossipBind = "0.0.0.0:7946"
	var logs bytes.Buffer
	cfg, err := o.Build(slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	cfg.warnLocalEngineURLs(cfg.Logger)
	if !strings.Contains(logs.String(), "engine URL names this host only") || strings.Contains(logs.String(), "s3cret") {
		t.Errorf("want the warning without the password: %s", logs.String())
	}
	// Without gossip the URL reaches no other host this way.
	o = DefaultOptions()
	o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://127.0.0.1:8000", "tcp://127.0.0.1:5557"
	logs.Reset()
	cfg, _ = o.Build(slog.New(slog.NewTextHandler(&logs, nil)))
	cfg.warnLocalEngineURLs(cfg.Logger)
	if logs.Len() != 0 {
		t.Errorf("warned without gossip: %s", logs.String())
	}
}

// A gossip address memberlist cannot use is refused when the options are
// built, before the sidecar connects to NATS, naming the flag.
func TestGossipAddressRefusedAtBuild(t *testing.T) {
	for _, tc := range []struct{ bind, advertise, want string }{
		{"0.0.0.0:7946", "engine-0.example", "(--gossip-advertise)"},
		{"localhost:7946", "", "(--gossip-bind)"},
		{"fd00::1:7946", "", "--gossip-bind"},
	} {
		o := DefaultOptions()
		o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://10.0.0.5:8000", "tcp://127.0.0.1:5557"
		o.GossipBind, o.GossipAdvertise = tc.bind, tc.advertise
		if _, err := o.Build(slog.New(slog.DiscardHandler)); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("bind %q advertise %q: %v, want a config error naming %s", tc.bind, tc.advertise, err, tc.want)
		}
	}
	o := DefaultOptions()
	o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://[fd00::1]:8000", "tcp://127.0.0.1:5557"
	o.GossipBind, o.GossipAdvertise = "0.0.0.0:7946", "fd00::1"
	cfg, err := o.Build(slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if g := cfg.Gossip; g.AdvertiseAddr != "fd00::1" || g.AdvertisePort != 0 || g.BindPort != 7946 {
		t.Errorf("gossip %+v: want fd00::1 advertised with the bind port", *g)
	}
	if err := cfg.Validate(); err != nil {
		t.Error(err)
	}
}

// ZMQ binds addresses, "*" and interface names; a host name fails on
// every retry with "no such device", so --bind-events refuses it at start.
func TestBindEventsNeedsAnAddress(t *testing.T) {
	for _, tc := range []struct {
		events string
		bind   bool
		ok     bool
	}{
		{"tcp://*:5557", true, true},
		{"tcp://0.0.0.0:5557", true, true},
		{"tcp://[::1]:5557", true, true},
		{"tcp://[::]:5557", true, true},
		{"tcp://lo:5557", true, true}, // an interface name
		{"ipc:///tmp/kv", true, true},
		{"tcp://engine-0.example:5557", true, false},
		{"tcp://localhost:5557", true, false},
		// Connecting to a name is libzmq's to resolve.
		{"tcp://engine-0.example:5557", false, true},
	} {
		cfg := DefaultConfig()
		cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: tc.events, Bind: tc.bind}}
		err := cfg.Validate()
		if (err == nil) != tc.ok {
			t.Errorf("events %s bind %v: %v, want ok %v", tc.events, tc.bind, err, tc.ok)
		}
		if err != nil && !strings.Contains(err.Error(), "not an IP address, * or a network interface") {
			t.Errorf("events %s: %v does not say what binds", tc.events, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", RankEvents: []string{"tcp://10.0.0.5:5557", "tcp://gpu1.example:5557"}, Bind: true}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "gpu1.example") {
		t.Errorf("a rank's host name: %v", err)
	}
}
