package demo

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// TestClusterPortBase starts a mesh of 2 engines and 2 ingresses at a
// port base and checks every listener is on 127.0.0.1 at the port
// ports.go documents, that the mesh works on them (the ingresses see
// every engine over gossip; a request's KV events reach the sidecars
// through the sockets the sidecars bind), and that the ingresses come
// back on the same ports for a second policy.
func TestClusterPortBase(t *testing.T) {
	const engines, ingresses = 2, 2
	n := MeshPorts(engines, ingresses)
	if n != 13 {
		t.Fatalf("MeshPorts(2, 2) = %d, want 13 (NATS, 4 per engine, 2 per ingress)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cl *Cluster
	var base int
	for attempt := 0; ; attempt++ { // another process may take a probed port before the mesh binds it
		base = testutil.FreePortBase(t, n)
		var err error
		cl, err = StartCluster(ctx, Config{Engines: engines, Ingresses: ingresses, PortBase: base, TimeScale: 10})
		if err == nil {
			break
		}
		if attempt == 4 || !errors.Is(err, syscall.EADDRINUSE) && !strings.Contains(err.Error(), "address already in use") {
			t.Fatalf("port base %d: %v", base, err)
		}
	}
	defer func() {
		if err := cl.Close(); err != nil {
			t.Error(err)
		}
	}()
	url := func(off int) string { return "http://127.0.0.1:" + strconv.Itoa(base+off) }
	for run, policy := range []string{"random", "kvmesh"} {
		if run > 0 {
			if err := cl.ResetCaches(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.StartIngresses(ctx, policy, run); err != nil {
			t.Fatalf("%s: %v", policy, err)
		}
		if got, want := cl.IngressURLs(), []string{url(9), url(11)}; strings.Join(got, " ") != strings.Join(want, " ") {
			t.Errorf("%s: ingresses at %v, want %v", policy, got, want)
		}
		for p := base; p < base+n; p++ {
			c, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)), 5*time.Second)
			if err != nil {
				t.Errorf("%s: port %d (base+%d): %v", policy, p, p-base, err)
				continue
			}
			c.Close()
		}
		if run == 0 {
			sendAndSeeEvents(ctx, t, cl, cl.IngressURLs()[0])
		}
		if err := cl.StopIngresses(); err != nil {
			t.Fatal(err)
		}
	}
	if got, want := cl.EngineURLs(), []string{url(1), url(5)}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("engines at %v, want %v", got, want)
	}
	if got, want := cl.m.nats.URL(), "nats://127.0.0.1:"+strconv.Itoa(base); got != want {
		t.Errorf("NATS at %s, want %s", got, want)
	}
	for i, sc := range cl.m.sidecars {
		if got, want := sc.Gossip().Addr(), "127.0.0.1:"+strconv.Itoa(base+4+4*i); got != want {
			t.Errorf("sidecar %d gossips at %s, want %s", i, got, want)
		}
	}
}

// sendAndSeeEvents sends one completion through the ingress at url and
// waits until some sidecar holds the KV blocks it stored.
func sendAndSeeEvents(ctx context.Context, t *testing.T, cl *Cluster, url string) {
	t.Helper()
	body := fmt.Sprintf(`{"model": "kvmesh-sim", "prompt": %q, "max_tokens": 2}`, strings.Repeat("port base ", 64))
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %s", resp.Status)
	}
	err = cl.m.waitFor(ctx, "the request's KV events at a sidecar", func() bool {
		for i, sc := range cl.m.sidecars {
			if keys, ok := sc.Keys(cl.m.engineIDs[i]); ok && len(keys[kvevents.TierGPU]) > 0 {
				return true
			}
		}
		return false
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
}

// TestCheckPortBase: a base is 0 (ephemeral) or 1..65535, and the last
// of the ports it must hold is at most 65535.
func TestCheckPortBase(t *testing.T) {
	for _, c := range []struct {
		base, n int
		want    string // "" = valid
	}{
		{0, 1000, ""},
		{1, 13, ""},
		{65523, 13, ""},
		{65524, 13, "take 13 ports, 65524..65536, past 65535 (want a base ≤ 65523)"},
		{65535, 1, ""},
		{-1, 13, "want 1..65535, or 0 for ephemeral ports"},
		{65536, 1, "want 1..65535"},
	} {
		err := CheckPortBase(c.base, c.n, "the mesh's listeners")
		if c.want == "" && err != nil || c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("CheckPortBase(%d, %d) = %v, want %q", c.base, c.n, err, c.want)
		}
	}
	err := Config{PortBase: 65520}.withDefaults().Validate()
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "NATS, 4 engines with their sidecars and 2 ingresses take 21 ports") {
		t.Errorf("default mesh at 65520: %v", err)
	}
}
