package sidecar

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

func TestParseEngineSpec(t *testing.T) {
	e, err := ParseEngineSpec("model=m,url=http://10.0.0.5:8000,events=tcp://10.0.0.5:5557,dp=2,block=16,role=decode")
	if err != nil {
		t.Fatal(err)
	}
	if e.ID != "10.0.0.5:8000" || e.DPSize != 2 || e.BlockSize != 16 || e.Role != "decode" {
		t.Fatalf("parsed %+v", e)
	}
	for _, bad := range []string{"id=a,bogus=1", "id=a,dp=x", "novalue"} {
		if _, err := ParseEngineSpec(bad); !errors.Is(err, ErrConfig) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

// TestParseEngineSpecHostPort: host=, port=, events-port= and
// replay-port= build the engine URL and endpoints with an IPv6 host
// bracketed, so a DaemonSet's host=$(NODE_IP) serves IPv4 and IPv6 nodes;
// beside the url=, events= or replay= they build, or incomplete, they are
// refused, saying why.
func TestParseEngineSpecHostPort(t *testing.T) {
	for _, tc := range []struct {
		spec, id, url, events, replay string
	}{
		{"model=m,host=10.0.0.5,port=8000,events-port=5557", "10.0.0.5:8000", "http://10.0.0.5:8000", "tcp://10.0.0.5:5557", ""},
		{"model=m,host=fd00:10:244:1::2a,port=8000,events-port=5557,replay-port=5558", "[fd00:10:244:1::2a]:8000",
			"http://[fd00:10:244:1::2a]:8000", "tcp://[fd00:10:244:1::2a]:5557", "tcp://[fd00:10:244:1::2a]:5558"},
		{"id=g0,model=m,host=[fd00::1],port=8001,events-port=5567,bind=true", "g0", "http://[fd00::1]:8001", "tcp://[fd00::1]:5567", ""},
		{"model=m,port=8000,host=gpu-0.example,events=tcp://127.0.0.1:5557", "gpu-0.example:8000", "http://gpu-0.example:8000", "tcp://127.0.0.1:5557", ""},
		{"model=m,url=http://10.0.0.5:8000,events=tcp://10.0.0.5:5557", "10.0.0.5:8000", "http://10.0.0.5:8000", "tcp://10.0.0.5:5557", ""},
	} {
		e, err := ParseEngineSpec(tc.spec)
		if err != nil {
			t.Errorf("%s: %v", tc.spec, err)
			continue
		}
		if e.ID != tc.id || e.URL != tc.url || e.Events != tc.events || e.Replay != tc.replay {
			t.Errorf("%s: id %q url %q events %q replay %q; want %q %q %q %q", tc.spec, e.ID, e.URL, e.Events, e.Replay, tc.id, tc.url, tc.events, tc.replay)
		}
		c := DefaultConfig()
		c.Engines = []EngineConfig{e}
		if err := c.Validate(); err != nil {
			t.Errorf("%s: %v", tc.spec, err)
		}
	}
	for _, tc := range []struct{ spec, err string }{
		{"model=m,url=http://h:1,host=10.0.0.5,port=8000,events-port=5557", "give them or url=, not both"},
		{"model=m,url=http://h:1,port=8000,events=tcp://h:2", "give them or url=, not both"},
		{"model=m,host=10.0.0.5,port=8000,events-port=5557,events=tcp://h:2", "give it or events=, not both"},
		{"model=m,host=10.0.0.5,port=8000,events-port=5557,replay-port=5558,replay=tcp://h:3", "give it or replay=, not both"},
		{"model=m,host=10.0.0.5,events-port=5557", "host= and port= go together"},
		{"model=m,port=8000,events-port=5557", "host=, which is missing"},
		{"model=m,url=http://h:1,events-port=5557", "host=, which is missing"},
		{"model=m,host=10.0.0.5:8000,port=8000,events-port=5557", `host "10.0.0.5:8000": want an IP address or a host name, without a port`},
		{"model=m,host=[fd00::1]:8000,port=8000,events-port=5557", "without a port"},
		{"model=m,host=,port=8000,events-port=5557", `host ""`},
		{"model=m,host=10.0.0.5,port=70000,events-port=5557", "port 70000: want 1..65535"},
		{"model=m,host=10.0.0.5,port=8000,events-port=0", "events-port: port 0"},
		{"model=m,host=10.0.0.5,port=x,events-port=5557", "port: strconv.Atoi"},
		// The last of two values won silently.
		{"id=a,model=m,url=http://h:1,events=tcp://h:2,model=n", "model= given twice"},
		{"id=a,id=b,model=m,url=http://h:1,events=tcp://h:2", "id= given twice"},
		// dp=0 ran as one rank.
		{"id=a,model=m,url=http://h:1,events=tcp://h:2,dp=0", "dp=0: want ≥ 1"},
	} {
		_, err := ParseEngineSpec(tc.spec)
		if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v; want a config error with %q", tc.spec, err, tc.err)
		}
	}
}

// TestOptionsBuild: the single-engine form, DaemonSet specs and gossip
// addresses resolve into one Config; every problem is listed.
func TestOptionsBuild(t *testing.T) {
	o := DefaultOptions()
	o.EngineSpecs = []string{"id=a,model=m,url=http://h:1,events=tcp://h:2"}
	o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://10.0.0.9:8000/v1", "tcp://10.0.0.9:5557"
	o.GossipBind, o.GossipAdvertise, o.GossipSeeds = "0.0.0.0:7946", "10.0.0.7:7000", []string{"seed:7946"}
	cfg, err := o.Build(slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Engines) != 2 || cfg.Engines[0].ID != "a" || cfg.Engines[1].ID != "10.0.0.9:8000" {
		t.Fatalf("engines %+v", cfg.Engines)
	}
	g := cfg.Gossip
	if g == nil || g.BindAddr != "0.0.0.0" || g.BindPort != 7946 || g.AdvertiseAddr != "10.0.0.7" || g.AdvertisePort != 7000 ||
		g.Meta.ID != "a" || len(g.Join) != 1 {
		t.Fatalf("gossip %+v", g)
	}

	o = DefaultOptions()
	o.EngineSpecs = []string{"bogus"}
	o.GossipSeeds = []string{"seed:1"}
	_, err = o.Build(slog.Default())
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "bogus") || !strings.Contains(err.Error(), "need a gossip bind") {
		t.Fatalf("problems: %v", err)
	}
	o.GossipBind = "nope"
	if _, err := o.Build(slog.Default()); err == nil || !strings.Contains(err.Error(), `gossip bind "nope"`) {
		t.Fatalf("bad bind: %v", err)
	}
}

// FuzzParseEngineSpec: a --engine spec (an operator's flag, a DaemonSet's
// list) parses or fails with ErrConfig, never panics, and one that also
// validates asks for a bounded number of DP ranks (each rank is a socket and
// a map: `dp=2000000000` must be refused before the sidecar allocates).
func FuzzParseEngineSpec(f *testing.F) {
	f.Add("model=m,url=http://10.0.0.5:8000,events=tcp://10.0.0.5:5557,dp=2,block=16,role=decode")
	f.Add("id=p,model=m,url=http://h:1,events=tcp://h:2,role=prefill,group=g,pd=sglang,bootstrap=8995,bind=true")
	f.Add("id=a,model=m,url=http://h:1,events=tcp://h:2,dp=2000000000")
	f.Add("id=a,dp=-1")
	f.Add("id=a,model=m,host=fd00::1,port=8000,events-port=5557,replay-port=5558,bind=true")
	f.Add("id=a,model=m,host=[10.0.0.5],port=8000,events=tcp://h:2")
	f.Add("novalue")
	f.Fuzz(func(t *testing.T, s string) {
		e, err := ParseEngineSpec(s)
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("%q: error %v does not wrap ErrConfig", s, err)
			}
			return
		}
		c := DefaultConfig()
		c.Engines = []EngineConfig{e}
		if err := c.Validate(); err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("%q: validation error %v does not wrap ErrConfig", s, err)
			}
			return
		}
		if e.DPSize < 0 || e.DPSize > kvevents.MaxDPSize {
			t.Fatalf("%q: accepted with dp size %d", s, e.DPSize)
		}
	})
}

// TestOptionsBuildBounds: --dp-size 0 (which ran as 1) and poll intervals
// so short they keep the engine or NATS busy are configuration errors; 0
// keeps its documented meaning (never; the default).
func TestOptionsBuildBounds(t *testing.T) {
	for _, tc := range []struct {
		set  func(*Options)
		want string
	}{
		{func(o *Options) { o.Engine.DPSize = 0 }, "--dp-size 0: want ≥ 1"},
		{func(o *Options) { o.Config.ModelsInterval = time.Nanosecond }, "--models-interval 1ns: want 0 (never) or ≥ 1s"},
		{func(o *Options) { o.Config.NATS.Auth.PingInterval = time.Millisecond }, "--nats-ping-interval 1ms"},
	} {
		o := DefaultOptions()
		o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://127.0.0.1:8000", "tcp://127.0.0.1:5557"
		tc.set(&o)
		if _, err := o.Build(slog.Default()); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v; want a config error with %q", err, tc.want)
		}
	}
	o := DefaultOptions()
	o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://127.0.0.1:8000", "tcp://127.0.0.1:5557"
	o.Config.ModelsInterval, o.Config.NATS.Auth.PingInterval = 0, 0
	if _, err := o.Build(slog.Default()); err != nil {
		t.Errorf("intervals 0: %v", err)
	}
	o.Config.ModelsInterval, o.Config.NATS.Auth.PingInterval = MinModelsInterval, MinNATSPingInterval
	if _, err := o.Build(slog.Default()); err != nil {
		t.Errorf("the shortest intervals: %v", err)
	}
}

// TestDefaultEngineIDHasNoUserinfo: the default engine id (the URL's
// host:port) leaves out the URL's userinfo, from --engine-url and from an
// --engine spec's url= alike: the id is gossiped, labels metrics, is logged
// and reaches clients in X-Kvmesh-Engine (tester h-ipv6 F1).
func TestDefaultEngineIDHasNoUserinfo(t *testing.T) {
	o := DefaultOptions()
	o.EngineSpecs = []string{"model=m,url=http://u:spec-secret@10.0.0.5:8000,events=tcp://10.0.0.5:5557"}
	o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://user:secret@[::1]:20010/v1", "tcp://[::1]:20011"
	cfg, err := o.Build(slog.Default())
	if err != nil {
		t.Fatal(err)
	}
	if len(cfg.Engines) != 2 || cfg.Engines[0].ID != "10.0.0.5:8000" || cfg.Engines[1].ID != "[::1]:20010" {
		t.Fatalf("engine ids %q, %q; want 10.0.0.5:8000 and [::1]:20010", cfg.Engines[0].ID, cfg.Engines[1].ID)
	}
	for raw, want := range map[string]string{
		"http://10.0.0.9:8000/v1":     "10.0.0.9:8000",
		"http://a@b@[fd00::1]:8000":   "[fd00::1]:8000",
		"10.0.0.9:8000/v1":            "10.0.0.9:8000",
		"http://user:pw@h:1:2:bad/v1": "h:1:2:bad",
		"http://user:p/ss@10.0.0.9:1": "10.0.0.9:1", // an unescaped '/' in the password
	} {
		if got := hostOf(raw); got != want {
			t.Errorf("hostOf(%q) = %q, want %q", raw, got, want)
		}
	}
	// Refused at start, and the refusal names no part of the password.
	o = DefaultOptions()
	o.Engine.Model, o.Engine.URL, o.Engine.Events = "m", "http://user:zq/secret#x@127.0.0.1:20010", "tcp://127.0.0.1:20011"
	cfg, err = o.Build(slog.Default())
	if err == nil {
		err = cfg.Validate()
	}
	if err == nil {
		t.Fatal("an engine URL with an unescaped '/' in its password was accepted")
	} else if strings.Contains(err.Error(), "zq") || strings.Contains(err.Error(), "secret") {
		t.Fatalf("the refusal shows the password: %v", err)
	}
}
