package sidecar

import (
	"errors"
	"log/slog"
	"strings"
	"testing"

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
