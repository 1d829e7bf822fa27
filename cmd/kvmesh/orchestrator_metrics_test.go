package main

import (
	"context"
	"net/http"
	"net/http/httptest"
	"net/url"
	"testing"

	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// TestOrchestratorMetricsRegistry: the orchestrator's /metrics has the Go
// runtime and process collectors (goroutine leaks, memory) and client-go's
// requests to the API server, labelled by verb, code and host only (no URL,
// namespace or resource: bounded).
func TestOrchestratorMetricsRegistry(t *testing.T) {
	reg := orchestratorRegistry()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/version" {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"major":"1","minor":"37","gitVersion":"v1.37.2"}`))
			return
		}
		http.Error(w, `{"kind":"Status","apiVersion":"v1","status":"Failure","reason":"NotFound","code":404}`, http.StatusNotFound)
	}))
	defer api.Close()
	kube := kubernetes.NewForConfigOrDie(&rest.Config{Host: api.URL})
	if _, err := kube.Discovery().ServerVersion(); err != nil {
		t.Fatal(err)
	}
	if _, err := kube.CoreV1().Pods("ns-with-a-long-name").Get(context.Background(), "pod-0", metav1.GetOptions{}); err == nil {
		t.Fatal("want a 404")
	}
	host := mustHost(t, api.URL)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf
	}
	for _, name := range []string{"go_goroutines", "go_memstats_heap_alloc_bytes", "process_resident_memory_bytes", "process_cpu_seconds_total",
		"kvmesh_orchestrator_reconciles_total", "rest_client_request_duration_seconds", "rest_client_requests_total"} {
		if got[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	allowed := map[string]map[string]bool{
		"rest_client_request_duration_seconds":      {"verb": true, "host": true},
		"rest_client_rate_limiter_duration_seconds": {"verb": true, "host": true},
		"rest_client_requests_total":                {"code": true, "method": true, "host": true},
	}
	seen := map[string]bool{}
	for name, labels := range allowed {
		mf := got[name]
		if mf == nil {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				if !labels[p.GetName()] {
					t.Errorf("%s has label %s=%q (want only %v)", name, p.GetName(), p.GetValue(), labels)
				}
				l[p.GetName()] = p.GetValue()
			}
			if l["host"] != host {
				continue // another test's API server (the collectors are the process's)
			}
			if name == "rest_client_requests_total" {
				seen[l["code"]+" "+l["method"]] = m.GetCounter().GetValue() >= 1
			}
			if name == "rest_client_request_duration_seconds" && l["verb"] == "GET" && m.GetHistogram().GetSampleCount() >= 2 {
				seen["latency GET"] = true
			}
		}
	}
	for _, w := range []string{"200 GET", "404 GET", "latency GET"} {
		if !seen[w] {
			t.Errorf("no %s request counted: %v", w, seen)
		}
	}
}

func mustHost(t *testing.T, raw string) string {
	t.Helper()
	u, err := url.Parse(raw)
	if err != nil {
		t.Fatal(err)
	}
	return u.Host
}
