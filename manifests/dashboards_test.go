package manifests

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/ingress/fair"
	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// labelsAddedByPrometheus are the target labels a PodMonitor scrape adds.
var labelsAddedByPrometheus = []string{"namespace", "pod", "container", "job", "instance", "endpoint", "service", "le"}

// series is the live exposition of a running mesh: sample name → label names.
type series map[string]map[string]bool

func (s series) scrape(t *testing.T, url string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("scrape %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("scrape %s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	labelRe := regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="`)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		name, rest, _ := strings.Cut(line, "{")
		if i := strings.IndexByte(name, ' '); i >= 0 {
			name, rest = name[:i], ""
		}
		if s[name] == nil {
			s[name] = map[string]bool{}
		}
		if rest != "" {
			labels, _, _ := strings.Cut(rest, "}")
			for _, m := range labelRe.FindAllStringSubmatch(labels, -1) {
				s[name][m[1]] = true
			}
		}
	}
}

// runMesh starts the mesh every dashboard describes (embedded NATS, two
// simulated engines with a CPU tier, a sidecar each, an ingress with an admin
// listener), drives requests through it and returns every /metrics endpoint.
func runMesh(t *testing.T) []string {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	ns := testutil.NATS(t)
	cfg := ingress.DefaultConfig()
	cfg.ID = "ingress-dash"
	cfg.Listen = "127.0.0.1:0"
	cfg.AdminListen = freeAddr(t)
	cfg.Scheduler.Policy = "kvmesh"
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ingress.ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{ns.URL()}}
	cfg.AccessLog = false
	srv, err := ingress.New(cfg, ingress.Deps{Registry: prometheus.NewRegistry(), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	const model = "sim/tiny"
	urls := []string{"http://" + cfg.AdminListen + "/metrics"}
	for i, id := range []string{"eng-a", "eng-b"} {
		sm, err := sim.Start(context.Background(), sim.Config{Model: model, KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
			Engine: engine.Config{BlockSize: 16, GPUBlocks: 64, CPUBlocks: 256, Profile: prof}, TimeScale: 500, Seed: uint64(i + 1), Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		urls = append(urls, sm.URL()+"/metrics")
		sc := sidecar.DefaultConfig()
		sc.Engines = []sidecar.EngineConfig{{ID: id, Model: model, URL: sm.URL(), DPSize: 1, RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints()}}
		sc.NATS = natsutil.DefaultConfig()
		sc.NATS.URLs = []string{ns.URL()}
		sc.AdminAddr = freeAddr(t)
		gc := gossip.DefaultConfig()
		gc.Name, gc.Profile, gc.Join = "sidecar-"+id, "local", []string{srv.GossipAddr()}
		gc.BroadcastInterval, gc.PushPullInterval = 50*time.Millisecond, 500*time.Millisecond
		gc.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "sidecar-" + id}
		gc.Logger = quiet
		sc.Gossip = &gc
		sc.GossipInterval, sc.ScrapeInterval, sc.Logger = 50*time.Millisecond, 100*time.Millisecond, quiet
		car, err := sidecar.New(sc)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); car.Run(ctx) }()
		t.Cleanup(func() { cancel(); car.Close(); <-done })
		urls = append(urls, "http://"+sc.AdminAddr+"/metrics")
	}
	urls = append(urls, runPDIngress(t, quiet)...)
	urls = append(urls, runOrchestrator(t, quiet, srv.GossipAddr()))
	base := "http://" + srv.Addr()
	testutil.WaitFor(t, 20*time.Second, "ingress ready with both engines", func() bool {
		resp, err := http.Get(base + "/ready")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	// Enough distinct prompts to overflow the 64-block GPU tier into the CPU tier.
	for i := 0; i < 24; i++ {
		ids := make([]string, 300)
		for j := range ids {
			ids[j] = fmt.Sprint(1 + (i*997+j*31)%4000)
		}
		body := `{"model":"` + model + `","prompt":[` + strings.Join(ids, ",") + `],"max_tokens":4}`
		resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	return urls
}

// runPDIngress runs the parts of the mesh the first ingress does not: a P/D
// pair of simulators speaking vLLM's NIXL protocol behind an ingress that
// disaggregates every request, with weighted fair admission across two
// tenants. It returns the /metrics URLs.
func runPDIngress(t *testing.T, quiet *slog.Logger) []string {
	t.Helper()
	const model = "sim/pd"
	cl := simtest.StartPDForTest(t, simtest.PDOptions{Base: sim.Config{Model: model, TimeScale: 500, Seed: 3, Logger: quiet, HTTPAddr: "127.0.0.1:0"}})
	var members pdMembers
	for i, s := range cl.Prefill {
		members = append(members, ingress.EngineInfo{Engine: scheduler.Engine{ID: fmt.Sprint("prefill-", i), Model: model, Healthy: true, Role: scheduler.RolePrefill}, URL: s.URL()})
	}
	for i, s := range cl.Decode {
		members = append(members, ingress.EngineInfo{Engine: scheduler.Engine{ID: fmt.Sprint("decode-", i), Model: model, Healthy: true, Role: scheduler.RoleDecode}, URL: s.URL()})
	}
	cfg := ingress.DefaultConfig()
	cfg.ID, cfg.Listen, cfg.AdminListen, cfg.AccessLog = "ingress-pd", "127.0.0.1:0", freeAddr(t), false
	cfg.PD.Policy = "kvmesh-always"
	cfg.TenantHeader = "X-Tenant"
	fc := fair.DefaultConfig()
	fc.Tenants = map[string]fair.Tenant{"team-a": {Weight: 1}, "team-b": {Weight: 3}}
	q, err := fair.New(fc)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(q.Collectors()...)
	srv, err := ingress.New(cfg, ingress.Deps{Registry: reg, Logger: quiet, AccessLog: quiet, Membership: members,
		Admitter: q, ClassifyError: ingress.FairErrors})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close() })
	for i := 0; i < 6; i++ {
		req, _ := http.NewRequest("POST", "http://"+srv.Addr()+"/v1/completions",
			strings.NewReader(fmt.Sprintf(`{"model":%q,"prompt":[%d,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20],"max_tokens":3}`, model, i+1)))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Tenant", []string{"team-a", "team-b"}[i%2])
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("P/D request %d: %s", i, resp.Status)
		}
	}
	urls := []string{"http://" + cfg.AdminListen + "/metrics"}
	for _, s := range append(cl.Prefill, cl.Decode...) {
		urls = append(urls, s.URL()+"/metrics")
	}
	return urls
}

// runOrchestrator runs the orchestrator against the package's real API
// server as a member of the mesh's gossip, with the P/D ModelDeployment and
// the AutoscalingPolicy of examples/, until the autoscaler has stepped; it
// returns the orchestrator's /metrics URL.
func runOrchestrator(t *testing.T, quiet *slog.Logger, seed string) string {
	t.Helper()
	srv := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	const ns = "dashboards"
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	crds, _ := filepath.Glob(filepath.Join("crds", "kvmesh.io_*.yaml"))
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, crds...); err != nil {
		t.Fatal(err)
	}
	gc := gossip.DefaultConfig()
	gc.Name, gc.Profile, gc.Join = "orchestrator", "local", []string{seed}
	gc.BroadcastInterval, gc.PushPullInterval = 50*time.Millisecond, 500*time.Millisecond
	gc.Meta = gossip.NodeMeta{Role: gossip.RoleOrchestrator, ID: "orchestrator"}
	gc.Logger = quiet
	node, err := gossip.New(gc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = node.Close() })
	oc := orchestrator.DefaultConfig()
	oc.Namespace, oc.LeaderElection, oc.Load, oc.AutoscaleInterval, oc.Logger = ns, false, node, 200*time.Millisecond, quiet
	ctrl, err := orchestrator.New(srv.Config, oc)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	reg := prometheus.NewRegistry()
	if err := orchestrator.Register(reg); err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	t.Cleanup(hs.Close)
	for _, f := range []string{"pd-modeldeployment.yaml", "autoscalingpolicy.yaml"} {
		if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{Namespace: ns}, kubetest.RepoFile(t, filepath.Join("examples", f))); err != nil {
			t.Fatalf("examples/%s: %v", f, err)
		}
	}
	return hs.URL + "/metrics"
}

// pdMembers is a fixed engine list with roles (gossip carries them in production).
type pdMembers []ingress.EngineInfo

func (m pdMembers) Engines(dst []ingress.EngineInfo) []ingress.EngineInfo { return append(dst, m...) }

func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestDashboardQueriesNameExportedMetrics: every query of every dashboard
// names metrics (and groups by labels) that a running mesh exports.
func TestDashboardQueriesNameExportedMetrics(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("monitoring", "dashboards", "*.json"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no dashboards (%v)", err)
	}
	urls := runMesh(t)
	live := series{}
	testutil.WaitFor(t, 20*time.Second, "the mesh's metrics after the traffic", func() bool {
		live = series{}
		for _, u := range urls {
			live.scrape(t, u)
		}
		return live["kvmesh_ingress_ttft_seconds_bucket"] != nil && live["kvmesh_sidecar_keys"]["tier"] &&
			live["kvmesh_orchestrator_autoscale_desired_replicas"] != nil && live["kvmesh_orchestrator_pod_actions_total"] != nil
	})
	checked := 0
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var dash any
		if err := json.Unmarshal(b, &dash); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, expr := range exprs(dash) {
			names := metricNames(expr)
			if len(names) == 0 {
				t.Errorf("%s: query reads no metric: %s", f, expr)
			}
			labels := map[string]bool{}
			for _, n := range names {
				if live[n] == nil {
					t.Errorf("%s: %q is not exported by a running mesh (query %s)", f, n, expr)
				}
				for l := range live[n] {
					labels[l] = true
				}
			}
			for _, g := range groupLabels(expr) {
				if !labels[g] && !slices.Contains(labelsAddedByPrometheus, g) {
					t.Errorf("%s: grouping label %q is on none of %v (query %s)", f, g, names, expr)
				}
			}
			checked++
		}
	}
	if checked < 20 {
		t.Fatalf("only %d queries checked", checked)
	}
}

// exprs returns every "expr" string in a dashboard.
func exprs(v any) []string {
	var out []string
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if s, ok := e.(string); ok && k == "expr" {
				out = append(out, s)
				continue
			}
			out = append(out, exprs(e)...)
		}
	case []any:
		for _, e := range x {
			out = append(out, exprs(e)...)
		}
	}
	return out
}

var reBy = regexp.MustCompile(`\b(?:by|without)\s*\(([^()]*)\)`)

// groupLabels returns the label names of an expression's by/without clauses.
func groupLabels(expr string) []string {
	var out []string
	for _, m := range reBy.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				out = append(out, l)
			}
		}
	}
	return out
}
