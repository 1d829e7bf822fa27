package sidecar

import (
	"io"
	"net/http"
	"strings"
	"testing"
)

// The sidecar's /metrics has the Go runtime and process series, as the
// ingress's has (black-box report: a leak or fd exhaustion in the sidecar
// was invisible).
func TestMetricsHaveRuntimeAndProcess(t *testing.T) {
	cfg := DefaultConfig()
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: "http://127.0.0.1:1"}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop, err := s.serveAdmin()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	resp, err := http.Get("http://" + s.AdminAddr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"\ngo_goroutines ", "\nprocess_open_fds ", "\nkvmesh_sidecar_engine_ready{"} {
		if !strings.Contains(string(b), name) {
			t.Errorf("/metrics has no %q", strings.TrimSpace(name))
		}
	}
}
