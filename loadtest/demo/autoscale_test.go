package demo

import (
	"context"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
	buildOut  []byte
)

// kvmeshBinary builds the kvmesh binary once for this package's tests (the
// local backend runs it as its children); TestMain removes it.
func kvmeshBinary(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvmesh-demo-bin-*")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kvmesh")
		buildOut, buildErr = exec.Command("go", "build", "-o", binPath, "github.com/kvmesh/kvmesh/cmd/kvmesh").CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("build kvmesh: %v\n%s", buildErr, buildOut)
	}
	return binPath
}

// TestMain removes the binary kvmeshBinary built, after every test and
// every -count run used it.
func TestMain(m *testing.M) {
	code := m.Run()
	if binPath != "" {
		_ = os.RemoveAll(filepath.Dir(binPath))
	}
	os.Exit(code)
}

// TestAutoscaleDemo runs `kvmesh demo --autoscale` in a short mode (a 40 s
// ramp): prefill and decode replicas go up under the ramp, come back down
// in the tail, and prefill/decode stays within the ratio band throughout;
// the requests are served.
func TestAutoscaleDemo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the local backend's processes for 40 s")
	}
	cfg := AutoscaleConfig{Exe: kvmeshBinary(t), Duration: 40 * time.Second, View: func(s AutoscaleSample) { t.Log(s.Line()) }}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	res, err := RunAutoscale(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := res.Check(); err != nil {
		t.Fatal(err)
	}
	for _, role := range []string{PrefillRole, DecodeRole} {
		first, peak, last := res.Peak(role)
		t.Logf("%s: %d → %d → %d", role, first, peak, last)
		if first != 1 {
			t.Errorf("%s started at %d replicas, want the spec's 1", role, first)
		}
	}
	if res.OK < res.Sent*9/10 {
		t.Errorf("%d of %d requests served", res.OK, res.Sent)
	}
	if math.IsNaN(res.Attainment) || res.Attainment <= 0 {
		t.Errorf("attainment %v", res.Attainment)
	}
}

func TestAutoscaleConfigValidate(t *testing.T) {
	good := AutoscaleConfig{}.withDefaults()
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	for name, mutate := range map[string]func(*AutoscaleConfig){
		"short":        func(c *AutoscaleConfig) { c.Duration = time.Second },
		"peak ≤ base":  func(c *AutoscaleConfig) { c.PeakRate = c.BaseRate },
		"max replicas": func(c *AutoscaleConfig) { c.MaxReplicas = 1 },
		"band":         func(c *AutoscaleConfig) { c.RatioMax = c.RatioMin / 2 },
	} {
		c := good
		mutate(&c)
		if c.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	// The ramp: up to the peak, a hold, down, and a low tail.
	for _, tc := range []struct {
		at    time.Duration
		phase string
		rate  float64
	}{{0, "up", 1}, {30 * time.Second, "hold", 24}, {50 * time.Second, "down", 24 - 23*(50-41.25)/11.25}, {70 * time.Second, "tail", 1}} {
		p, r := good.rateAt(tc.at)
		if p != tc.phase || math.Abs(r-tc.rate) > 1e-6 {
			t.Errorf("at %v: %s %.3f, want %s %.3f", tc.at, p, r, tc.phase, tc.rate)
		}
	}
}

func TestAutoscaleResultCheck(t *testing.T) {
	s := func(p, d int32) AutoscaleSample {
		return AutoscaleSample{Prefill: RoleSample{Desired: p}, Decode: RoleSample{Desired: d}, Ratio: float64(p) / float64(d)}
	}
	ok := &AutoscaleResult{Band: [2]float64{0.5, 2}, Samples: []AutoscaleSample{s(1, 1), s(2, 4), s(1, 2)}}
	if err := ok.Check(); err != nil {
		t.Errorf("good run: %v", err)
	}
	for name, r := range map[string]*AutoscaleResult{
		"never up":    {Band: [2]float64{0.5, 2}, Samples: []AutoscaleSample{s(1, 1), s(1, 2), s(1, 1)}},
		"never down":  {Band: [2]float64{0.5, 2}, Samples: []AutoscaleSample{s(1, 1), s(2, 2), s(2, 2)}},
		"out of band": {Band: [2]float64{0.5, 2}, Samples: []AutoscaleSample{s(1, 1), s(1, 4), s(1, 1)}},
		"too few":     {Band: [2]float64{0.5, 2}, Samples: []AutoscaleSample{s(1, 1)}},
	} {
		if r.Check() == nil {
			t.Errorf("%s: passed", name)
		}
	}
}

// TestRampGenWaitsForInFlight: requests in flight when the run ends are
// waited for, not cancelled and counted failed.
func TestRampGenWaitsForInFlight(t *testing.T) {
	entered, release := make(chan struct{}, maxInFlight), make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered <- struct{}{}
		select {
		case <-release:
		case <-r.Context().Done():
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"choices\":[{\"text\":\"b\"}]}\n\ndata: [DONE]\n\n")
	}))
	defer srv.Close()
	cfg := AutoscaleConfig{}.withDefaults()
	cfg.PromptTokens, cfg.OutputTokens = 4, 2
	g := newRampGen(cfg, srv.URL)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); g.run(ctx, time.Now()) }()
	select {
	case <-entered: // one request in flight
	case <-time.After(time.Minute):
		t.Fatal("no request arrived")
	}
	cancel() // the run ends with it in flight
	close(release)
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("run did not return")
	}
	sent, ok, failed, _ := g.totals()
	if failed != 0 || ok != sent || sent < 1 {
		t.Fatalf("sent %d, ok %d, failed %d (last error %q): want every request in flight served", sent, ok, failed, g.lastError())
	}
}
