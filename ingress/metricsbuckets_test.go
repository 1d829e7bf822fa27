package ingress

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	jose "github.com/go-jose/go-jose/v4"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/kvmesh/kvmesh/ingress/fair"
)

// The request latency histograms reach 30 min (streams last minutes), the
// stage histogram 1 s (the engine /tokenize fallback), and the fair queue's
// kvmesh_ingress_tenant_* series carry the replica's ingress label as the
// other kvmesh_ingress_* series do.
func TestMetricBucketsAndLabels(t *testing.T) {
	o := DefaultOptions()
	o.Config.Engines = []StaticEngine{{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}}
	fc := fair.DefaultConfig()
	o.Config.FairQueue = &fc
	s, err := o.NewServer(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.m.stageParse.Observe(0.001)
	mfs, err := s.deps.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]float64{}
	tenantLabel := ""
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil && len(h.GetBucket()) > 0 {
				b := h.GetBucket()
				top[mf.GetName()] = b[len(b)-1].GetUpperBound()
			}
			if mf.GetName() == "kvmesh_ingress_tenant_admitted_total" {
				for _, l := range m.GetLabel() {
					if l.GetName() == "ingress" {
						tenantLabel = l.GetValue()
					}
				}
			}
		}
	}
	for name, want := range map[string]float64{"kvmesh_ingress_request_duration_seconds": 1800, "kvmesh_ingress_ttft_seconds": 1800, "kvmesh_ingress_stage_seconds": 1} {
		if top[name] != want {
			t.Errorf("%s: top bucket %v, want %v", name, top[name], want)
		}
	}
	if !slices.Contains(latencyBuckets, 300) || tenantLabel == "" || tenantLabel != s.cfg.ID {
		t.Errorf("tenant series' ingress label %q, replica %q", tenantLabel, s.cfg.ID)
	}
}

// Every kvmesh_ingress_* family an ingress registers carries the replica's
// ingress label (docs/OPERATIONS.md), those of the components Options
// builds included: the API keys' and routes' reloads, JWT rejections and
// the fair queue's. Checked on the descriptors, so a family with no series
// yet (a vector never incremented) is checked too, and on what a scrape
// gathers.
func TestEveryIngressSeriesHasItsLabel(t *testing.T) {
	dir := t.TempDir()
	keys, jwks := filepath.Join(dir, "keys"), filepath.Join(dir, "jwks.json")
	if err := os.WriteFile(keys, []byte("alice sk-alice-00000001\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	set, _ := json.Marshal(jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &k.PublicKey, KeyID: "k1", Algorithm: "ES256", Use: "sig"}}})
	if err := os.WriteFile(jwks, set, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(auth.DefaultEnvVar, "")
	os.Unsetenv(auth.DefaultEnvVar)
	o := DefaultOptions()
	o.Config = testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"})
	o.Config.ID = "ingress-labelled"
	o.Config.Routes, o.Config.RoutesOptional = filepath.Join(dir, "routes.yaml"), true
	fc := fair.DefaultConfig()
	o.Config.FairQueue = &fc
	o.APIKeysFile = keys
	o.JWT.JWKSFile, o.JWT.Audience = jwks, "kvmesh"
	s, err := o.NewServer(t.Context(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })

	descs := make(chan *prometheus.Desc)
	go func() { s.deps.Registry.Describe(descs); close(descs) }()
	// Desc has no accessors: its String is Desc{fqName: "...", ..., constLabels: {...}, variableLabels: {...}}.
	descRE := regexp.MustCompile(`^Desc\{fqName: "([^"]*)".*, constLabels: \{(.*)\}, variableLabels: \{(.*)\}\}$`)
	names := map[string]bool{}
	for d := range descs {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("unparsed descriptor %s", d)
		}
		if !strings.HasPrefix(m[1], "kvmesh_ingress_") {
			continue
		}
		names[m[1]] = true
		if !strings.Contains(m[2], `ingress="ingress-labelled"`) {
			t.Errorf("%s: no ingress label: %s", m[1], d)
		}
	}
	for _, n := range []string{"kvmesh_ingress_requests_total", "kvmesh_ingress_api_keys_reloads_total", "kvmesh_ingress_api_keys_reload_errors_total",
		"kvmesh_ingress_route_reloads_total", "kvmesh_ingress_route_reload_errors_total", "kvmesh_ingress_jwt_rejected_total", "kvmesh_ingress_tenant_admitted_total"} {
		if !names[n] {
			t.Errorf("%s not registered", n)
		}
	}

	if _, err := s.deps.Auth.Check([]byte("Bearer not.a.jwt")); err == nil {
		t.Fatal("a malformed token was accepted")
	}
	mfs, err := s.deps.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if !strings.HasPrefix(mf.GetName(), "kvmesh_ingress_") {
			continue
		}
		for _, m := range mf.GetMetric() {
			if !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "ingress" && l.GetValue() == "ingress-labelled" }) {
				t.Errorf("%s: a series without the ingress label: %v", mf.GetName(), m.GetLabel())
			}
		}
	}
}
