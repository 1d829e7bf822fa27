package gossip

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestCheckRoute: which engine entries may carry which address, on each
// lane (routing.go).
func TestCheckRoute(t *testing.T) {
	meta := NodeMeta{Role: RoleSidecar, ID: "e1", EngineURL: "http://10.0.0.5:8000"}
	eng := func(id, url, boot string, relayed bool) *entry {
		return &entry{Origin: "s", Kind: kindEngine, Name: id, Engine: &EngineState{ID: id, URL: url, Bootstrap: boot}, relayed: relayed}
	}
	e2 := eng("e2", "http://10.0.0.5:8001", "", false)
	for _, c := range []struct {
		name string
		meta NodeMeta
		have *entry
		e    *entry
		want routeVerdict
	}{
		{"metadata's engine, its URL, gossip", meta, nil, eng("e1", "http://10.0.0.5:8000", "", false), routeOK},
		{"metadata's engine, its URL, lane", meta, nil, eng("e1", "http://10.0.0.5:8000", "10.0.0.5:8998", true), routeOK},
		{"metadata's engine, its URL with a slash (an earlier sidecar's metadata)", NodeMeta{Role: RoleSidecar, ID: "e1", EngineURL: "http://10.0.0.5:8000/"}, nil, eng("e1", "http://10.0.0.5:8000", "", false), routeOK},
		{"metadata's engine, another URL, gossip", meta, nil, eng("e1", "http://10.0.0.9:8000", "", false), routeMismatch},
		{"metadata's engine, another URL, lane", meta, nil, eng("e1", "http://10.0.0.9:8000", "", true), routeMismatch},
		{"bootstrap on another host", meta, nil, eng("e1", "http://10.0.0.5:8000", "10.0.0.9:8998", false), routeMismatch},
		{"bootstrap without a URL (not routed)", NodeMeta{Role: RoleSidecar}, nil, eng("p", "", "10.0.0.9:8998", false), routeOK},
		{"lane changes the bootstrap port", meta, eng("e1", "http://10.0.0.5:8000", "10.0.0.5:8998", false), eng("e1", "http://10.0.0.5:8000", "10.0.0.5:1", true), routeMismatch},
		{"other engine, gossip", meta, nil, e2, routeOK},
		{"other engine, lane, gossip delivered it", meta, e2, eng("e2", "http://10.0.0.5:8001", "", true), routeOK},
		{"other engine, lane first", meta, nil, eng("e2", "http://10.0.0.5:8001", "", true), routeUnattested},
		{"other engine, lane, another URL", meta, e2, eng("e2", "http://10.0.0.9:8001", "", true), routeMismatch},
		{"metadata without a URL, lane first", NodeMeta{Role: RoleIngress, ID: "e1"}, nil, eng("e1", "http://10.0.0.9:8000", "", true), routeUnattested},
		{"no address, lane first", meta, nil, eng("e3", "", "", true), routeOK},
		{"not an engine", meta, nil, &entry{Origin: "s", Kind: kindInFlight, relayed: true}, routeOK},
	} {
		if got, _ := checkRoute(c.meta, c.have, c.e); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

// TestEngineURLBoundToMetadataOverGossip: a member's engine state whose URL
// is not the one its gossip metadata gives that engine is refused and
// counted on the gossip lane too (a sidecar whose state and metadata
// disagree, or another member's forgery forwarded by push/pull); the
// matching one is taken.
func TestEngineURLBoundToMetadataOverGossip(t *testing.T) {
	in := start(t, testConfig("ingress-1", RoleIngress, nil))
	sc := testConfig("sidecar-1", RoleSidecar, nil, in.Addr())
	sc.Meta = NodeMeta{Role: RoleSidecar, ID: "e1", Model: "m", EngineURL: "http://127.0.0.1:8000"}
	s := start(t, sc)
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && s.NumMembers() == 2 })
	s.SetEngine(EngineState{ID: "e1", Model: "m", URL: "http://127.0.0.1:9999"})
	testutil.WaitFor(t, 10*time.Second, "the entry refused", func() bool { return in.m.urlMismatch.Load() > 0 })
	if v, ok := in.Engine("e1"); ok {
		t.Fatalf("e1 taken with url %q", v.URL)
	}
	s.SetEngine(EngineState{ID: "e1", Model: "m", URL: "http://127.0.0.1:8000"})
	testutil.WaitFor(t, 10*time.Second, "e1 with its metadata's URL", func() bool {
		v, ok := in.Engine("e1")
		return ok && v.URL == "http://127.0.0.1:8000"
	})
}
