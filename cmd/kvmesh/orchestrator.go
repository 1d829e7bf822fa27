package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/logutil"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/orchestrator"
	"github.com/kvmesh/kvmesh/orchestrator/view"
	"github.com/kvmesh/kvmesh/orchestrator/webhook"
)

// runOrchestrator runs the ModelDeployment controller and, when asked, the
// sidecar-injection webhook: in cluster (service account, --webhook-listen,
// the certificate kept in the Secret --webhook-secret) or out of cluster
// (--kubeconfig, --webhook-addr HOST:PORT registered by URL with a CA
// generated in memory).
func runOrchestrator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if localMode(args) { // --local FILE: the same resources as processes on loopback
		return runLocalOrchestrator(ctx, args, stdout, stderr)
	}
	cfg := orchestrator.DefaultConfig()
	sc := webhook.DefaultSidecarConfig()
	fs := newFlagSet("orchestrator", stderr)
	var probs flagProblems
	// Listed here so -h shows the mode; localMode takes --local before this
	// flag set parses anything.
	fs.String("local", "", "run the ModelDeployments, AutoscalingPolicies and ModelRoutes of this YAML `FILE` on this machine "+
		"instead, as kvmesh sim + sidecar processes on loopback, without Kubernetes (kvmesh orchestrator --local FILE -h lists that mode's flags)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (default: in-cluster service account)")
	fs.StringVar(&cfg.Namespace, "namespace", "", "watch only this namespace (default: all)")
	fs.IntVar(&cfg.Workers, "workers", cfg.Workers, "reconcile workers")
	fs.BoolVar(&cfg.LeaderElection, "leader-elect", cfg.LeaderElection, "elect one active replica through a Lease")
	fs.StringVar(&cfg.LeaseNamespace, "lease-namespace", cfg.LeaseNamespace, "namespace of the leader-election Lease")
	fs.StringVar(&cfg.LeaseName, "lease-name", cfg.LeaseName, "name of the leader-election Lease")
	webhookAddr := fs.String("webhook-addr", "", "out of cluster: serve the webhook on HOST:PORT and register https://HOST:PORT by URL")
	webhookListen := fs.String("webhook-listen", "", "in cluster: serve the webhook here (e.g. 0.0.0.0:9443)")
	certDir := fs.String("webhook-cert-dir", "", "read the webhook certificate from this directory (tls.crt, tls.key[, ca.crt]; re-read every 30 s) instead of the Secret")
	certSecret := fs.String("webhook-secret", webhook.SecretName, "[namespace/]name of the kubernetes.io/tls Secret holding the webhook certificate, created or renewed when needed and shared by the replicas (namespace: the Service's); with --webhook-addr only when given")
	svc := fs.String("webhook-service", "kvmesh/kvmesh-orchestrator", "in cluster: namespace/name[:port] of the webhook's Service")
	failOpen := fs.Bool("webhook-fail-open", false, "admit pods uninjected when the webhook is down")
	takeover := fs.Bool("webhook-takeover", false, "with --webhook-addr: register the URL even over a configuration calling a Service (the install's webhook, which the orchestrator in the cluster writes back)")
	fs.StringVar(&sc.Image, "sidecar-image", sc.Image, "image of the injected sidecar")
	fs.StringVar(&sc.NATS, "sidecar-nats", sc.NATS, "NATS URLs given to injected sidecars")
	fs.StringVar(&sc.NATSPrefix, "sidecar-nats-prefix", sc.NATSPrefix, "NATS subject prefix given to injected sidecars (--nats-prefix; empty: their default, kvmesh)")
	fs.StringVar(&sc.GossipJoin, "sidecar-join", sc.GossipJoin, "gossip seeds given to injected sidecars (empty: no gossip)")
	metricsAddr := fs.String("metrics-addr", "", "serve /metrics and /healthz here (empty: off)")
	gossipBind := fs.String("gossip-bind", "", "join the mesh's gossip from IP:port (IPv6 in brackets) to run AutoscalingPolicies (empty: policies are not run)")
	gossipAdvertise := fs.String("gossip-advertise", "", "the IP, or IP:port (IPv6 in brackets), other members dial, when it differs from --gossip-bind")
	join := fs.String("join", "", "gossip seeds host:port, comma-separated")
	// The same keys and rotation list as every other member: the orchestrator
	// reads the Secret they all read (docs/SECURITY.md, "Gossip").
	var gossipKey []byte
	var gossipExtra [][]byte
	gossipKeyFlag(fs, &gossipKey, &gossipExtra, &probs)
	fs.DurationVar(&cfg.AutoscaleInterval, "autoscale-interval", cfg.AutoscaleInterval, "how often AutoscalingPolicies are stepped")
	fs.StringVar(&cfg.RouteConfigMap, "routes-configmap", cfg.RouteConfigMap, "render each namespace's ModelRoutes into this ConfigMap (key routes.yaml, the ingress's --routes file; empty: ModelRoutes off)")
	fs.StringVar(&cfg.PrometheusURL, "prometheus-url", "", "Prometheus base URL for policy metrics with source prometheus (a policy's spec.prometheus.address wins)")
	qps := fs.Float64("kube-api-qps", defaultKubeQPS, "requests per second to the API server (client-go's rate limit; its default, 5, creates a large deployment's pods at 5 a second)")
	burst := fs.Int("kube-api-burst", defaultKubeBurst, "requests to the API server allowed in a burst above --kube-api-qps")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	logFormat := fs.String("log-format", logutil.JSON, "log format on stderr: json or text")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if !(*qps > 0) || math.IsInf(*qps, 0) || *burst < 1 { // NaN fails > 0
		probs.add("--kube-api-qps %v and --kube-api-burst %d: want a finite rate > 0 and a burst ≥ 1", *qps, *burst)
	}
	if cfg.Workers < 1 {
		probs.add("--workers %d: want ≥ 1", cfg.Workers)
	}
	if *gossipBind != "" && cfg.AutoscaleInterval <= 0 {
		probs.add("--autoscale-interval %v: want > 0", cfg.AutoscaleInterval)
	}
	if sc.NATSPrefix != "" {
		if err := natsutil.ValidatePrefix(sc.NATSPrefix); err != nil {
			probs.add("--sidecar-nats-prefix: %v", err)
		}
	}
	rest := cfg
	rest.Workers = max(rest.Workers, 1) // named above
	probs.addErr(rest.Validate())       // the rest of what orchestrator.New checks, before anything starts
	if *metricsAddr != "" {
		probs.addErr(checkListenAddr("metrics-addr", *metricsAddr))
	}
	var level slog.Level // every problem is listed together, as the other commands do
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		probs.add("--log-level %q: want debug, info, warn or error", *logLevel)
	}
	if err := logutil.CheckFormat(*logFormat); err != nil {
		probs.add("--%v", err)
	}
	if *webhookAddr != "" && *webhookListen != "" {
		probs.add("--webhook-addr and --webhook-listen exclude each other")
	}
	noWebhook, noGossip := *webhookAddr == "" && *webhookListen == "", *gossipBind == ""
	rules := []offFlag{{"lease-namespace", !cfg.LeaderElection, "without --leader-elect"},
		{"lease-name", !cfg.LeaderElection, "without --leader-elect"},
		{"webhook-service", *webhookAddr != "", "with --webhook-addr (registered by URL)"},
		{"webhook-takeover", *webhookAddr == "", "without --webhook-addr (in cluster the replicas register the install's Service)"}}
	for _, f := range []string{"webhook-cert-dir", "webhook-secret", "webhook-service", "webhook-fail-open", "sidecar-image", "sidecar-nats", "sidecar-nats-prefix", "sidecar-join"} {
		rules = append(rules, offFlag{f, noWebhook, "without --webhook-addr or --webhook-listen"})
	}
	for _, f := range []string{"join", "gossip-advertise", "gossip-key", "autoscale-interval", "prometheus-url"} {
		rules = append(rules, offFlag{f, noGossip, "without --gossip-bind (AutoscalingPolicies run only in the mesh)"})
	}
	probs.refuseOff(fs, rules)
	if err := probs.err(); err != nil {
		return err
	}
	cfg.Logger = logutil.New(stderr, *logFormat, level)
	klogToSlog(cfg.Logger)
	if *gossipBind != "" {
		node, err := joinMesh(*gossipBind, *gossipAdvertise, *join, gossipKey, gossipExtra, cfg.Logger)
		if err != nil {
			return err
		}
		defer node.Close()
		cfg.Load = node
	}
	restCfg, err := orchestratorKubeConfig(*kubeconfig, *qps, *burst)
	if err != nil {
		return err
	}
	if *webhookAddr != "" {
		if err := checkWebhookTakeover(ctx, restCfg, *takeover, cfg.Logger); err != nil {
			return err
		}
	}
	ctrl, err := orchestrator.New(restCfg, cfg)
	if err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if !set["sidecar-image"] {
		// In a pod, injected sidecars run the orchestrator's own image, so
		// a kustomize images: pin (or an upgrade) moves both together.
		if img, err := ownImage(ctx, restCfg, os.Getenv("POD_NAMESPACE"), os.Getenv("POD_NAME")); err != nil {
			cfg.Logger.Warn("sidecar image: own image unknown, using the default", "image", sc.Image, "err", err)
		} else if img != "" {
			sc.Image = img
		}
	}
	wcfg, err := webhookRunConfig(*webhookAddr, *webhookListen, *svc, *certDir, *certSecret, set)
	if err != nil {
		return err
	}
	return runOrchestratorParts(ctx, restCfg, ctrl, wcfg, sc, *failOpen, *metricsAddr, cfg.Logger, stdout)
}

// checkWebhookTakeover refuses, before anything starts, to register
// --webhook-addr's URL over the install's webhook (a configuration calling
// a Service: the orchestrator in the cluster keeps it, and would write it
// back), unless --webhook-takeover says to; then it warns.
func checkWebhookTakeover(ctx context.Context, restCfg *rest.Config, takeover bool, log *slog.Logger) error {
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	err = webhook.CheckURLTakeover(cctx, kube)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, webhook.ErrInstalledConfiguration):
		return fmt.Errorf("orchestrator --webhook-addr: %w", err)
	case !takeover:
		return fmt.Errorf("orchestrator --webhook-addr: %w. Stop the orchestrator in the cluster (or uninstall it) and delete the configuration "+
			"(kubectl delete mutatingwebhookconfiguration %s), or pass --webhook-takeover to register this URL over it", err, webhook.ConfigName)
	}
	log.Warn("--webhook-takeover: registering this process's URL over the install's webhook configuration; engine pods are admitted through this "+
		"process only, an orchestrator running in the cluster writes its Service back (a tug of war), and a later install or upgrade must delete the "+
		"configuration first", "configuration", webhook.ConfigName, "was", err)
	return nil
}

// checkListenAddr is nil when addr, flag name's value, is HOST:PORT with
// a numeric port in 0..65535 (HOST may be empty: every address), the form
// net.Listen takes; else the usage problem naming the flag. A bad address
// is then found before anything starts, not at its bind.
func checkListenAddr(name, addr string) error {
	_, port, err := net.SplitHostPort(addr)
	if err == nil {
		if _, perr := strconv.ParseUint(port, 10, 16); perr != nil {
			err = fmt.Errorf("port %q: want 0..65535", port)
		}
	}
	if err != nil {
		return fmt.Errorf("--%s %q: want HOST:PORT (IPv6 in brackets): %w", name, addr, err)
	}
	return nil
}

// ownImage is the image of this process's container, read from its own pod
// (env POD_NAMESPACE and POD_NAME, from the downward API): the container
// named "orchestrator", else the pod's only one. "" with no error out of a
// pod (the variables unset).
func ownImage(ctx context.Context, restCfg *rest.Config, ns, name string) (string, error) {
	if ns == "" || name == "" {
		return "", nil
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return "", err
	}
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	pod, err := kube.CoreV1().Pods(ns).Get(gctx, name, metav1.GetOptions{})
	if err != nil {
		return "", err
	}
	for _, c := range pod.Spec.Containers {
		if c.Name == "orchestrator" {
			return c.Image, nil
		}
	}
	if len(pod.Spec.Containers) == 1 {
		return pod.Spec.Containers[0].Image, nil
	}
	return "", fmt.Errorf("pod %s/%s has no container named orchestrator", ns, name)
}

// webhookRunConfig maps the webhook flags onto a RunConfig (nil: no
// webhook); set names the flags given. The certificate comes from
// --webhook-cert-dir when given, else in cluster from the Secret, else (out
// of cluster) from the Secret only when --webhook-secret is given, or is
// generated in memory.
func webhookRunConfig(addr, listen, svc, certDir, secret string, set map[string]bool) (*webhook.RunConfig, error) {
	if addr == "" && listen == "" {
		return nil, nil
	}
	if set["webhook-cert-dir"] && set["webhook-secret"] {
		return nil, fmt.Errorf("%w: --webhook-cert-dir and --webhook-secret exclude each other", errUsage)
	}
	ns, name, port, err := webhook.ParseService(svc)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	cfg := &webhook.RunConfig{Listen: listen,
		Hosts:  []string{name + "." + ns + ".svc", name + "." + ns + ".svc.cluster.local"},
		Target: webhook.Target{ServiceNamespace: ns, Service: name, ServicePort: port}}
	if addr != "" {
		host, port, err := net.SplitHostPort(addr)
		if err != nil {
			return nil, fmt.Errorf("%w: --webhook-addr: %w", errUsage, err)
		}
		cfg.Listen, cfg.URLHost, cfg.Hosts, cfg.Target = net.JoinHostPort(host, port), host, []string{host}, webhook.Target{}
	}
	secretNS, secretName, ok := strings.Cut(secret, "/")
	if !ok {
		secretNS, secretName = ns, secret
	}
	switch {
	case certDir != "":
		cfg.Certs = &webhook.DirSource{Dir: certDir, Hosts: cfg.Hosts}
	case secretName == "" || secretNS == "" || strings.Contains(secretName, "/"):
		return nil, fmt.Errorf("%w: --webhook-secret %q: want [namespace/]name", errUsage, secret)
	case listen != "" || set["webhook-secret"]:
		cfg.Certs = &webhook.SecretSource{Namespace: secretNS, Name: secretName, Hosts: cfg.Hosts}
	}
	return cfg, nil
}

// errControllerStopped: the controller returned while the process was to
// keep running.
var errControllerStopped = errors.New("orchestrator: the controller stopped on its own")

// runOrchestratorParts runs the controller, the webhook and the metrics
// server; the first to fail stops the others.
func runOrchestratorParts(ctx context.Context, restCfg *rest.Config, ctrl *orchestrator.Controller, wcfg *webhook.RunConfig,
	sc webhook.SidecarConfig, failOpen bool, metricsAddr string, log *slog.Logger, stdout io.Writer) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errs := make([]error, 3)
	wg.Go(func() {
		errs[0] = ctrl.Run(ctx)
		if errs[0] == nil && ctx.Err() == nil {
			// Run returns early only on a failure (a lost lease is rejoined
			// in-process): never exit 0 while the process should run.
			errs[0] = errControllerStopped
		}
		cancel()
	})
	if wcfg != nil {
		kube, err := kubernetes.NewForConfig(restCfg)
		if err != nil {
			return err
		}
		wcfg.Sidecar, wcfg.Logger, wcfg.Target.FailOpen = sc, log, failOpen
		wcfg.Leader = ctrl // out of cluster only the leader registers its URL
		switch src := wcfg.Certs.(type) {
		case *webhook.SecretSource:
			src.Kube, src.Log = kube, log
		case *webhook.DirSource:
			src.Log = log
		}
		wcfg.Ready = func(where string) { fmt.Fprintln(stdout, "webhook registered at", where) }
		wg.Go(func() { errs[1] = webhook.Run(ctx, kube, *wcfg); cancel() })
	}
	if metricsAddr != "" {
		reg := orchestratorRegistry()
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
		srv := &http.Server{Addr: metricsAddr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
		wg.Go(func() {
			go func() { <-ctx.Done(); _ = srv.Close() }()
			if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
				errs[2] = err
				cancel()
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

// orchestratorRegistry holds what the orchestrator's /metrics serves: the
// Go runtime and process collectors (as the ingress's and the sidecar's),
// the controller's and the webhook's metrics, and client-go's requests to
// the API server (rest_client_*).
func orchestratorRegistry() *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	_ = orchestrator.Register(reg)
	_ = webhook.Register(reg)
	return reg
}

// joinMesh makes the orchestrator a gossip member so AutoscalingPolicies
// read every engine's live load. key encrypts; extra are accepted during a
// rotation.
func joinMesh(bind, advertise, join string, key []byte, extra [][]byte, log *slog.Logger) (*gossip.Node, error) {
	g := gossip.DefaultConfig()
	if err := g.SetAddrs(bind, advertise); err != nil {
		return nil, fmt.Errorf("%w: %w", errUsage, err)
	}
	g.Join, g.Logger = commaList(join), log
	g.Meta = gossip.NodeMeta{Role: gossip.RoleOrchestrator}
	g.SecretKey, g.ExtraKeys = key, extra
	return gossip.New(g)
}

// The orchestrator's client rate limit, controller-runtime's defaults:
// client-go's own (5 per second, bursts of 10) would create a large
// deployment's pods at 5 a second.
const (
	defaultKubeQPS   = 20
	defaultKubeBurst = 30
)

// orchestratorFieldManager names the orchestrator's writes in objects'
// managedFields, and so in a server-side apply's conflict (`conflict with
// "kvmesh-orchestrator"`, docs/INSTALL.md): the API server takes a write's
// manager from its user agent, up to the first '/', which client-go
// otherwise starts with the executable's name.
const orchestratorFieldManager = "kvmesh-orchestrator"

// orchestratorKubeConfig is kubeConfig with the orchestrator's rate limit
// and user agent (orchestratorFieldManager).
func orchestratorKubeConfig(path string, qps float64, burst int) (*rest.Config, error) {
	cfg, err := kubeConfig(path)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = float32(qps), burst
	_, suffix, _ := strings.Cut(rest.DefaultKubernetesUserAgent(), "/") // version (os/arch) kubernetes/commit
	cfg.UserAgent = orchestratorFieldManager + "/" + suffix
	return cfg, nil
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	cfg, err := rest.InClusterConfig()
	if err != nil {
		return nil, fmt.Errorf("not in a cluster (%w); pass --kubeconfig", err)
	}
	return cfg, nil
}

// runGet prints kvmesh.io resources with the CRDs' printer columns.
func runGet(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if engineResource(args) { // engines come from the mesh, not the API server
		return runEngines(ctx, "get", args, stdout, stderr)
	}
	return runView(ctx, "get", args, stdout, stderr)
}

// runDescribe prints one kvmesh.io object's spec, status and events.
func runDescribe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if engineResource(args) {
		return runEngines(ctx, "describe", args, stdout, stderr)
	}
	return runView(ctx, "describe", args, stdout, stderr)
}

func runView(ctx context.Context, verb string, args []string, stdout, stderr io.Writer) error {
	o, err := parseViewArgs(verb, args, stderr)
	if err != nil {
		return err
	}
	pos, ns := o.pos, o.namespace
	res, err := view.Resource(pos[0])
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	cfg, err := kubeConfig(o.kubeconfig)
	if err != nil {
		return err
	}
	name := ""
	if len(pos) == 2 {
		name = pos[1]
	}
	if verb == "describe" {
		return view.Describe(ctx, cfg, res, ns, name, stdout)
	}
	if o.all {
		ns = ""
	}
	return view.Get(ctx, cfg, res, ns, name, stdout, stderr)
}

// viewArgs are kvmesh get/describe's parsed command line.
type viewArgs struct {
	pos        []string // the resource and the optional name
	kubeconfig string
	namespace  string // --namespace/-n, else the kubeconfig context's (in a pod: the pod's), else "default"
	all        bool   // --all-namespaces/-A
}

// parseViewArgs parses kvmesh get/describe's arguments with kubectl's
// spellings (-n, -A), flags before or after the positional arguments.
func parseViewArgs(verb string, args []string, stderr io.Writer) (viewArgs, error) {
	var o viewArgs
	fs := newFlagSet(verb, stderr)
	fs.StringVar(&o.kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig file (env KUBECONFIG; default: in-cluster)")
	fs.StringVar(&o.namespace, "namespace", "", "namespace (default: the kubeconfig context's, else \"default\")")
	fs.StringVar(&o.namespace, "n", "", "shorthand for --namespace")
	fs.BoolVar(&o.all, "all-namespaces", false, "every namespace (get only)")
	fs.BoolVar(&o.all, "A", false, "shorthand for --all-namespaces")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: kvmesh %s modeldeployments|autoscalingpolicies|rolescalers|modelroutes [NAME] [-n NS]%s\n", verb, map[string]string{"get": " [-A]"}[verb])
		fmt.Fprintf(stderr, "       kvmesh %s %s --join HOST:PORT[,...] (engines in the mesh's gossip; -h for its flags)\n", verb, map[string]string{"get": "engines [NAME]", "describe": "engine NAME"}[verb])
		fs.PrintDefaults()
	}
	// Flags may follow the positional arguments, as with kubectl.
	for len(args) > 0 {
		if err := parseFlags(fs, args, 100); err != nil {
			return o, err
		}
		if fs.NArg() == 0 {
			break
		}
		o.pos, args = append(o.pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(o.pos) < 1 || len(o.pos) > 2 || (verb == "describe" && len(o.pos) != 2) {
		fs.Usage()
		return o, fmt.Errorf("%w: want a resource and %s", errUsage, map[string]string{"get": "an optional name", "describe": "a name"}[verb])
	}
	if o.all && len(o.pos) == 2 { // kubectl's rule too; describe always names one
		return o, fmt.Errorf("%w: --all-namespaces lists a resource; it is not read with a name (use -n)", errUsage)
	}
	nsGiven := false
	fs.Visit(func(f *flag.Flag) { nsGiven = nsGiven || f.Name == "namespace" || f.Name == "n" })
	if o.all && nsGiven { // -A won silently
		return o, fmt.Errorf("%w: give --namespace (-n) or --all-namespaces (-A), not both", errUsage)
	}
	if o.namespace == "" {
		o.namespace = kubeNamespace(o.kubeconfig)
	}
	return o, nil
}

// kubeNamespace is the namespace kubectl would use without -n: the kubeconfig's
// current context's, or in a pod (no kubeconfig, as kubeConfig) the pod's own;
// "default" when neither says.
func kubeNamespace(kubeconfig string) string {
	if kubeconfig == "" {
		if b, err := os.ReadFile("/var/run/secrets/kubernetes.io/serviceaccount/namespace"); err == nil {
			if ns := strings.TrimSpace(string(b)); ns != "" {
				return ns
			}
		}
		return "default"
	}
	rules := &clientcmd.ClientConfigLoadingRules{ExplicitPath: kubeconfig}
	ns, _, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).Namespace()
	if err != nil || ns == "" {
		return "default" // a broken kubeconfig fails in kubeConfig, with its own error
	}
	return ns
}
