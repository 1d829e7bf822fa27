package main

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/klog/v2"

	"github.com/kvmesh/kvmesh/ingress/routes"
	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/logutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/webhook"
)

// TestOrchestratorUnderRBAC runs `kvmesh orchestrator --kubeconfig F
// --webhook-addr 127.0.0.1:0` as the ServiceAccount of
// manifests/orchestrator/rbac.yaml against an API server in RBAC mode: the
// P/D example's pods are created and get the sidecar through the webhook
// the command registered; its headless Service, edited by hand, is set
// back; deleting the deployment cleans up.
func TestOrchestratorUnderRBAC(t *testing.T) {
	s := kubetest.StartT(t, kubetest.Options{RBAC: true})
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kvmesh"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	crds, _ := filepath.Glob(filepath.Join("..", "..", "manifests", "crds", "kvmesh.io_*.yaml"))
	// rbac.yaml lets the orchestrator update its webhook's configuration, not create it: webhook.yaml does.
	files := append(crds, filepath.Join("..", "..", "manifests", "orchestrator", "rbac.yaml"), filepath.Join("..", "..", "manifests", "orchestrator", "webhook.yaml"))
	if _, err := kubetest.ApplyFiles(ctx, s.Config, kubetest.ApplyOptions{}, files...); err != nil {
		t.Fatal(err)
	}
	tok, err := admin.CoreV1().ServiceAccounts("kvmesh").CreateToken(ctx, "kvmesh-orchestrator",
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	kc := clientcmdapi.NewConfig()
	kc.Clusters["c"] = &clientcmdapi.Cluster{Server: s.URL, CertificateAuthorityData: s.CAPEM}
	kc.AuthInfos["sa"] = &clientcmdapi.AuthInfo{Token: tok.Status.Token}
	kc.Contexts["c"] = &clientcmdapi.Context{Cluster: "c", AuthInfo: "sa"}
	kc.CurrentContext = "c"
	kubeconfig := filepath.Join(t.TempDir(), "kubeconfig")
	if err := clientcmd.WriteToFile(*kc, kubeconfig); err != nil {
		t.Fatal(err)
	}
	// RBAC is in force: the orchestrator's identity cannot read secrets.
	saCfg, _ := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if _, err := kubernetes.NewForConfigOrDie(saCfg).CoreV1().Secrets("kvmesh").List(ctx, metav1.ListOptions{}); !apierrors.IsForbidden(err) {
		t.Fatalf("listing secrets as the orchestrator: %v, want Forbidden", err)
	}

	// Its own pod, as the Deployment's downward API names it: injected
	// sidecars get its image (read under RBAC).
	const ownImg = "registry.example/kvmesh:v1.2.3"
	if _, err := admin.CoreV1().Pods("kvmesh").Create(ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "kvmesh-orchestrator-0"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "orchestrator", Image: ownImg}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Setenv("POD_NAMESPACE", "kvmesh")
	t.Setenv("POD_NAME", "kvmesh-orchestrator-0")

	var out, errOut testutil.SyncBuffer
	testutil.Run(t, "orchestrator", func(octx context.Context) error {
		// webhook.yaml's configuration calls the install's Service: taking it over is asked for
		// (TestOrchestratorRefusesInstalledWebhook).
		return runOrchestrator(octx, []string{"--kubeconfig", kubeconfig, "--webhook-addr", "127.0.0.1:0", "--webhook-takeover",
			"--metrics-addr", "127.0.0.1:0", "--log-level", "debug"}, &out, &errOut)
	}, errOut.String)
	testutil.WaitFor(t, time.Minute, "the webhook to be registered by URL", func() bool {
		c, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, "kvmesh-sidecar-injector", metav1.GetOptions{})
		return err == nil && c.Webhooks[0].ClientConfig.URL != nil && strings.Contains(out.String(), "webhook registered at https://127.0.0.1:")
	})
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "models"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := kubetest.ApplyFiles(ctx, s.Config, kubetest.ApplyOptions{Namespace: "models"}, filepath.Join("..", "..", "examples", "pd-modeldeployment.yaml")); err != nil {
		t.Fatal(err)
	}
	sel := metav1.ListOptions{LabelSelector: v1alpha1.LabelDeployment + "=llama-pd"}
	testutil.WaitFor(t, 2*time.Minute, "4 engine pods, each with the injected native sidecar", func() bool {
		l, err := admin.CoreV1().Pods("models").List(ctx, sel)
		if err != nil || len(l.Items) != 4 {
			return false
		}
		for _, p := range l.Items {
			if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != "kvmesh-sidecar" {
				return false
			}
			if img := p.Spec.InitContainers[0].Image; img != ownImg {
				t.Fatalf("injected sidecar image %q, want the orchestrator's own %q", img, ownImg)
			}
		}
		return true
	})
	// The orchestrator's writes carry a stable field manager, whatever the
	// executable is called (a server-side apply's conflict names it).
	dynAdmin := dynamic.NewForConfigOrDie(s.Config)
	md, err := dynAdmin.Resource(v1alpha1.ModelDeploymentsResource).Namespace("models").Get(ctx, "llama-pd", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(md.GetManagedFields(), func(f metav1.ManagedFieldsEntry) bool { return f.Manager == "kvmesh-orchestrator" }) {
		t.Errorf("no managedFields entry of kvmesh-orchestrator on the deployment: %v", md.GetManagedFields())
	}
	// The headless Service, its selector edited by hand, is set back under
	// the install's rules (they lacked update on services: the deployment
	// wedged, k8s tester 2).
	svcs := admin.CoreV1().Services("models")
	if _, err := svcs.Patch(ctx, "llama-pd", types.StrategicMergePatchType, []byte(`{"spec":{"selector":{"kvmesh.io/deployment":"other"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "the Service's selector set back", func() bool {
		svc, err := svcs.Get(ctx, "llama-pd", metav1.GetOptions{})
		return err == nil && svc.Spec.Selector[v1alpha1.LabelDeployment] == "llama-pd"
	})
	// kvmesh get / describe show the CRDs' printer columns and the events.
	var got *testutil.SyncBuffer
	testutil.WaitFor(t, time.Minute, "kvmesh get md to show the status columns", func() bool {
		got = &testutil.SyncBuffer{}
		return runGet(ctx, []string{"md", "--kubeconfig", s.Kubeconfig, "-n", "models"}, got, &errOut) == nil &&
			strings.Contains(got.String(), "0/1")
	})
	for _, w := range []string{"NAME", "MODEL", "READY", "STATUS", "llama-pd", "meta-llama/Llama-3.1-8B-Instruct", "GroupsNotReady"} {
		if !strings.Contains(got.String(), w) {
			t.Errorf("kvmesh get md lacks %q:\n%s", w, got.String())
		}
	}
	var desc *testutil.SyncBuffer
	testutil.WaitFor(t, time.Minute, "describe to show the GroupCreated event", func() bool {
		desc = &testutil.SyncBuffer{}
		err := runDescribe(ctx, []string{"modeldeployments", "llama-pd", "--kubeconfig", s.Kubeconfig, "--namespace", "models"}, desc, &errOut)
		return err == nil && strings.Contains(desc.String(), "GroupCreated") && strings.Contains(desc.String(), "readyGroups")
	})
	// ModelRoutes under the same RBAC: the route file (a ConfigMap the
	// orchestrator creates, then may only read and update by name) and the
	// routes' status, shown by kvmesh get.
	if _, err := kubetest.ApplyFiles(ctx, s.Config, kubetest.ApplyOptions{Namespace: "models"}, filepath.Join("..", "..", "examples", "modelroutes.yaml")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "the route file with the example's two routes", func() bool {
		cm, err := admin.CoreV1().ConfigMaps("models").Get(ctx, "kvmesh-routes", metav1.GetOptions{})
		if err != nil {
			return false
		}
		c, err := routes.Parse([]byte(cm.Data["routes.yaml"]))
		return err == nil && len(c.Routes) == 2 && c.Routes[0].Name == "chat-canary"
	})
	testutil.WaitFor(t, time.Minute, "kvmesh get modelroutes to show both accepted and programmed", func() bool {
		got = &testutil.SyncBuffer{}
		if runGet(ctx, []string{"modelroutes", "--kubeconfig", s.Kubeconfig, "-n", "models"}, got, &errOut) != nil {
			return false
		}
		lines := strings.Split(strings.TrimSpace(got.String()), "\n")
		return len(lines) == 3 && strings.Contains(lines[0], "PROGRAMMED") &&
			strings.Count(lines[1], "True") == 2 && strings.Count(lines[2], "True") == 2
	})
	mds := dynAdmin.Resource(v1alpha1.ModelDeploymentsResource).Namespace("models")
	if err := mds.Delete(ctx, "llama-pd", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 2*time.Minute, "the deployment and its pods gone", func() bool {
		_, err := mds.Get(ctx, "llama-pd", metav1.GetOptions{})
		l, lerr := admin.CoreV1().Pods("models").List(ctx, sel)
		return apierrors.IsNotFound(err) && lerr == nil && len(l.Items) == 0
	})
	if lease, err := admin.CoordinationV1().Leases("kvmesh").Get(ctx, "kvmesh-orchestrator", metav1.GetOptions{}); err != nil || lease.Spec.HolderIdentity == nil {
		t.Errorf("leader lease: %v %v", lease, err)
	}
}

// TestOrchestratorManifestAndInjectedArgsAreRealFlags parses the
// orchestrator Deployment's arguments and the arguments the webhook gives
// injected sidecars with the binary's own flag sets, so a renamed flag
// breaks this test instead of a cluster.
func TestOrchestratorManifestAndInjectedArgsAreRealFlags(t *testing.T) {
	envRef := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	check := func(what string, args []string) {
		t.Helper()
		for i, a := range args {
			args[i] = envRef.ReplaceAllString(a, "10.0.0.1")
		}
		var stdout, stderr bytes.Buffer
		if code := run(append(args, "-h"), &stdout, &stderr); code != 0 {
			t.Errorf("%s: kvmesh %s rejected (exit %d): %s", what, strings.Join(args, " "), code, stderr.String())
		}
	}
	cs := orchestratorContainers(t)
	if len(cs) != 1 {
		t.Fatalf("%d containers in deployment.yaml", len(cs))
	}
	var args []string
	for _, a := range cs[0].(map[string]any)["args"].([]any) {
		args = append(args, a.(string))
	}
	check("deployment.yaml", args)
	h := &webhook.Handler{Sidecar: webhook.DefaultSidecarConfig()}
	pod := &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: "e", Labels: map[string]string{webhook.LabelInject: "true"}, Annotations: map[string]string{webhook.AnnotationModel: "m"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}},
	}
	raw, _ := json.Marshal(pod)
	req, _ := json.Marshal(admissionv1.AdmissionReview{Request: &admissionv1.AdmissionRequest{UID: "u",
		Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Object: runtime.RawExtension{Raw: raw}}})
	out, err := h.Review(req)
	if err != nil || out.Response.Patch == nil {
		t.Fatalf("review: %v %+v", err, out)
	}
	var ops []struct {
		Value json.RawMessage `json:"value"`
	}
	if err := json.Unmarshal(out.Response.Patch, &ops); err != nil {
		t.Fatal(err)
	}
	var injected []corev1.Container
	if err := json.Unmarshal(ops[0].Value, &injected); err != nil || len(injected) != 1 {
		t.Fatalf("patch value: %s (%v)", ops[0].Value, err)
	}
	check("injected sidecar", injected[0].Args)
	// And kvmesh sidecar reads every one of them (no flag whose feature is off).
	if _, err := sidecarOptions(injected[0].Args[1:], io.Discard); err != nil {
		t.Errorf("injected sidecar: %v", err)
	}
}

// TestOrchestratorRefusesInstalledWebhook: `kvmesh orchestrator --webhook-addr`
// on a cluster where the install's webhook configuration (webhook.yaml,
// calling the Service of the orchestrator in the cluster) exists refuses
// before it starts, naming the configuration, its Service and the flag that
// overrides, and leaves it as it was. With --webhook-takeover it registers
// its URL, warning; a configuration calling a URL (an earlier run out of
// cluster) is registered over without the flag.
func TestOrchestratorRefusesInstalledWebhook(t *testing.T) {
	s := kubetest.StartT(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	if _, err := admin.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "kvmesh"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	files, _ := filepath.Glob(filepath.Join("..", "..", "manifests", "crds", "kvmesh.io_*.yaml"))
	files = append(files, filepath.Join("..", "..", "manifests", "orchestrator", "webhook.yaml"))
	if _, err := kubetest.ApplyFiles(ctx, s.Config, kubetest.ApplyOptions{}, files...); err != nil {
		t.Fatal(err)
	}
	configs := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	installed, err := configs.Get(ctx, webhook.ConfigName, metav1.GetOptions{})
	if err != nil || installed.Webhooks[0].ClientConfig.Service == nil {
		t.Fatalf("webhook.yaml's configuration: %v %+v", err, installed)
	}
	callsURL := func() bool {
		c, err := configs.Get(ctx, webhook.ConfigName, metav1.GetOptions{})
		return err == nil && c.Webhooks[0].ClientConfig.URL != nil
	}
	args := []string{"--kubeconfig", s.Kubeconfig, "--webhook-addr", "127.0.0.1:0", "--lease-namespace", "kvmesh"}

	// Without the flag: refused. (Were it not, it would run and register its URL: stopped then.)
	var out, errOut testutil.SyncBuffer
	rctx, stop := context.WithCancel(ctx)
	result, finished := make(chan error, 1), make(chan struct{})
	go func() { defer close(finished); result <- runOrchestrator(rctx, args, &out, &errOut) }()
	t.Cleanup(func() { stop(); <-finished })
	var refused error
	testutil.WaitFor(t, time.Minute, "the orchestrator to refuse, or to register its URL", func() bool {
		select {
		case refused = <-result:
			return true
		default:
			return callsURL()
		}
	})
	if refused == nil {
		stop()
		<-finished
		t.Fatalf("took the install's webhook over: the configuration now calls a URL\n%s", errOut.String())
	}
	if !errors.Is(refused, webhook.ErrInstalledConfiguration) || errors.Is(refused, errUsage) {
		t.Errorf("refused with %v, want ErrInstalledConfiguration", refused)
	}
	for _, w := range []string{"MutatingWebhookConfiguration " + webhook.ConfigName, "the Service kvmesh/kvmesh-orchestrator", "--webhook-takeover",
		"kubectl delete mutatingwebhookconfiguration " + webhook.ConfigName} {
		if !strings.Contains(refused.Error(), w) {
			t.Errorf("refusal %q does not say %q", refused, w)
		}
	}
	if c, err := configs.Get(ctx, webhook.ConfigName, metav1.GetOptions{}); err != nil || c.ResourceVersion != installed.ResourceVersion {
		t.Errorf("the refusing orchestrator changed the configuration: %v %+v", err, c)
	}

	// With it: registered by URL, and said loudly.
	run := func(extra ...string) {
		t.Helper()
		var out, errOut testutil.SyncBuffer
		octx, stop := context.WithCancel(ctx)
		result := make(chan error, 1)
		go func() { result <- runOrchestrator(octx, append(slices.Clone(args), extra...), &out, &errOut) }()
		defer func() {
			stop()
			if err := <-result; err != nil {
				t.Errorf("%v: %v\n%s", extra, err, errOut.String())
			}
		}()
		testutil.WaitFor(t, time.Minute, "the webhook to be registered by URL", func() bool {
			return callsURL() && strings.Contains(out.String(), "webhook registered at https://127.0.0.1:")
		})
		if took := strings.Contains(errOut.String(), "--webhook-takeover: registering this process's URL over the install's webhook configuration"); took != (len(extra) > 0) {
			t.Errorf("%v: warned of a takeover: %v\n%s", extra, took, errOut.String())
		}
	}
	run("--webhook-takeover")
	// The configuration now calls a URL (that run's): a new run registers over it without the flag.
	run()
}

// An orchestrator flag whose feature is off is refused by name before
// anything starts; the Deployment's own arguments are all read (that run
// gets as far as the kubeconfig).
func TestOrchestratorFlagsNotRead(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--leader-elect=false", "--lease-name", "x"}, []string{"--lease-name is not read without --leader-elect"}},
		{[]string{"--sidecar-image", "img", "--webhook-fail-open", "--join", "127.0.0.1:1", "--prometheus-url", "http://p"},
			[]string{"--sidecar-image is not read without --webhook-addr or --webhook-listen", "--webhook-fail-open is not read without --webhook",
				"--join is not read without --gossip-bind", "--prometheus-url is not read without --gossip-bind"}},
		{[]string{"--webhook-addr", "127.0.0.1:0", "--webhook-service", "a/b"}, []string{"--webhook-service is not read with --webhook-addr"}},
		{[]string{"--webhook-listen", "127.0.0.1:0", "--webhook-takeover"}, []string{"--webhook-takeover is not read without --webhook-addr"}},
	} {
		err := runOrchestrator(context.Background(), append([]string{"--kubeconfig", "/nonexistent"}, c.args...), io.Discard, io.Discard)
		checkRefused(t, c.args, err, c.want)
	}
	args := []string{"--kubeconfig", "/nonexistent"}
	for _, a := range orchestratorContainers(t)[0].(map[string]any)["args"].([]any)[1:] {
		switch f, _, _ := strings.Cut(a.(string), "="); f {
		case "--gossip-bind", "--metrics-addr":
			a = f + "=127.0.0.1:0" // loopback only
		case "--join":
			a = f + "=127.0.0.1:1"
		case "--gossip-advertise":
			a = f + "=127.0.0.1" // $(POD_IP), which Kubernetes expands
		}
		args = append(args, a.(string))
	}
	if err := runOrchestrator(context.Background(), args, io.Discard, io.Discard); errors.Is(err, errUsage) || err == nil ||
		!strings.Contains(err.Error(), "nonexistent") {
		t.Errorf("deployment.yaml's arguments: %v, want the kubeconfig's error", err)
	}
}

// The webhook flags pick the certificate's source: in cluster the Secret
// (by default kvmesh-webhook-tls in the Service's namespace), out of
// cluster a certificate generated in memory unless a Secret is named, a
// directory when given; contradictions are usage errors.
func TestWebhookRunConfigFlags(t *testing.T) {
	const svc = "kvmesh/kvmesh-orchestrator"
	cases := []struct {
		name                      string
		addr, listen, dir, secret string
		set                       []string
		want                      string // source type and where
		hosts                     []string
		err                       bool
	}{
		{name: "in cluster", listen: "0.0.0.0:9443", secret: webhook.SecretName, want: "secret kvmesh/kvmesh-webhook-tls",
			hosts: []string{"kvmesh-orchestrator.kvmesh.svc", "kvmesh-orchestrator.kvmesh.svc.cluster.local"}},
		{name: "in cluster, other namespace", listen: ":9443", secret: "ops/hook-tls", set: []string{"webhook-secret"}, want: "secret ops/hook-tls"},
		{name: "in cluster, directory", listen: ":9443", secret: webhook.SecretName, dir: "/etc/tls", set: []string{"webhook-cert-dir"}, want: "dir /etc/tls"},
		{name: "out of cluster", addr: "127.0.0.1:9443", secret: webhook.SecretName, want: "generated", hosts: []string{"127.0.0.1"}},
		{name: "out of cluster, Secret", addr: "127.0.0.1:9443", secret: "kvmesh-webhook-tls", set: []string{"webhook-secret"},
			want: "secret kvmesh/kvmesh-webhook-tls", hosts: []string{"127.0.0.1"}},
		{name: "both sources", listen: ":9443", secret: "x", dir: "/d", set: []string{"webhook-secret", "webhook-cert-dir"}, err: true},
		{name: "bad secret", listen: ":9443", secret: "a/b/c", set: []string{"webhook-secret"}, err: true},
		{name: "no webhook", secret: webhook.SecretName, want: "none"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			set := map[string]bool{}
			for _, f := range tc.set {
				set[f] = true
			}
			cfg, err := webhookRunConfig(tc.addr, tc.listen, svc, tc.dir, tc.secret, set)
			if tc.err {
				if !errors.Is(err, errUsage) {
					t.Fatalf("err %v, want a usage error", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			got := "none"
			if cfg != nil {
				switch src := cfg.Certs.(type) {
				case nil:
					got = "generated"
				case *webhook.SecretSource:
					got = "secret " + src.Namespace + "/" + src.Name
				case *webhook.DirSource:
					got = "dir " + src.Dir
				}
			}
			if got != tc.want {
				t.Errorf("source %q, want %q", got, tc.want)
			}
			if tc.hosts != nil && !slices.Equal(cfg.Hosts, tc.hosts) {
				t.Errorf("hosts %v, want %v", cfg.Hosts, tc.hosts)
			}
		})
	}
}

// The Deployment passes the pod's name and namespace, from which the
// orchestrator reads its own image for injected sidecars
// (TestOrchestratorUnderRBAC checks the image of the sidecars it injects).
func TestOrchestratorDeploymentNamesItsPod(t *testing.T) {
	want := map[string]string{"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
	for _, c := range orchestratorContainers(t) {
		env, _, _ := unstructured.NestedSlice(c.(map[string]any), "env")
		for _, e := range env {
			path, _, _ := unstructured.NestedString(e.(map[string]any), "valueFrom", "fieldRef", "fieldPath")
			if name, _ := e.(map[string]any)["name"].(string); want[name] == path {
				delete(want, name)
			}
		}
	}
	if len(want) != 0 {
		t.Fatalf("deployment.yaml lacks the downward-API variables %v", want)
	}
}

// orchestratorContainers is every pod template container in
// manifests/orchestrator/deployment.yaml.
func orchestratorContainers(t *testing.T) []any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "manifests", "orchestrator", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var all []any
	for _, o := range objs {
		cs, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
		all = append(all, cs...)
	}
	return all
}

// The orchestrator's client is not left at client-go's rate limit (5 per
// second), at which a large deployment's pods came at 5 a second.
func TestOrchestratorClientRateLimit(t *testing.T) {
	kc := filepath.Join(t.TempDir(), "kubeconfig")
	const doc = `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
contexts: [{name: c, context: {cluster: c}}]
current-context: c
`
	if err := os.WriteFile(kc, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	cfg, err := orchestratorKubeConfig(kc, defaultKubeQPS, defaultKubeBurst)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.QPS != 20 || cfg.Burst != 30 {
		t.Errorf("QPS %v, burst %d; want 20 and 30", cfg.QPS, cfg.Burst)
	}
	err = runOrchestrator(context.Background(), []string{"--kubeconfig", kc, "--kube-api-qps", "0"}, io.Discard, io.Discard)
	if !errors.Is(err, errUsage) {
		t.Errorf("--kube-api-qps 0: %v, want a usage error", err)
	}
}

// TestOrchestratorGossipKeyList: the orchestrator is a gossip member and
// reads the Secret every member reads, so --gossip-key and
// $KVMESH_GOSSIP_KEY take the same comma-separated rotation list
// (docs/SECURITY.md, "Gossip"): two keys join the mesh and the run gets as
// far as the kubeconfig; a bad key is a usage error naming it.
func TestOrchestratorGossipKeyList(t *testing.T) {
	oldKey := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{1}, 32))
	newKey := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte{2}, 16))
	base := []string{"--kubeconfig", "/nonexistent", "--gossip-bind", "127.0.0.1:0"}
	reachedKube := func(what string, err error) {
		t.Helper()
		if errors.Is(err, errUsage) || err == nil || !strings.Contains(err.Error(), "nonexistent") {
			t.Errorf("%s: %v, want the kubeconfig's error", what, err)
		}
	}
	t.Setenv("KVMESH_GOSSIP_KEY", "")
	reachedKube("--gossip-key OLD,NEW", runOrchestrator(context.Background(), append(base, "--gossip-key", oldKey+","+newKey), io.Discard, io.Discard))
	t.Setenv("KVMESH_GOSSIP_KEY", newKey+","+oldKey)
	reachedKube("KVMESH_GOSSIP_KEY=NEW,OLD", runOrchestrator(context.Background(), base, io.Discard, io.Discard))
	args := append(base, "--gossip-key", oldKey+",nope")
	if err := runOrchestrator(context.Background(), args, io.Discard, io.Discard); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "gossip key 1") {
		t.Errorf("%v: %v, want a usage error naming key 1", args, err)
	}
}

// TestOrchestratorGossipAddrs: the orchestrator parses its gossip addresses
// as every member does (gossip.Config.SetAddrs): IPv6 and an advertise
// address are accepted, a bad bind address is a usage error naming it, and
// --gossip-advertise without --gossip-bind is refused.
func TestOrchestratorGossipAddrs(t *testing.T) {
	t.Setenv("KVMESH_GOSSIP_KEY", "")
	run := func(args ...string) error {
		return runOrchestrator(context.Background(), append([]string{"--kubeconfig", "/nonexistent"}, args...), io.Discard, io.Discard)
	}
	if err := run("--gossip-bind", "127.0.0.1:0", "--gossip-advertise", "127.0.0.1"); errors.Is(err, errUsage) || err == nil || !strings.Contains(err.Error(), "nonexistent") {
		t.Errorf("--gossip-advertise: %v, want the kubeconfig's error", err)
	}
	if ln, err := net.Listen("tcp", "[::1]:0"); err == nil {
		ln.Close()
		if err := run("--gossip-bind", "[::1]:0", "--gossip-advertise", "::1"); errors.Is(err, errUsage) || err == nil || !strings.Contains(err.Error(), "nonexistent") {
			t.Errorf("IPv6 --gossip-bind: %v, want the kubeconfig's error", err)
		}
	}
	if err := run("--gossip-bind", "nope"); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("--gossip-bind nope: %v, want a usage error naming it", err)
	}
	if err := run("--gossip-advertise", "127.0.0.1"); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "gossip-advertise") {
		t.Errorf("--gossip-advertise alone: %v, want it refused by name", err)
	}
}

// TestOrchestratorConfigMistakes: every configuration mistake is a usage
// error naming its flag, found before the kubeconfig is read (here a
// missing file, whose error would come first otherwise): a non-finite
// client rate, no workers, a metrics address net.Listen refuses.
func TestOrchestratorConfigMistakes(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--kube-api-qps", "NaN"}, "--kube-api-qps NaN"},
		{[]string{"--kube-api-qps", "Inf"}, "--kube-api-qps +Inf"},
		{[]string{"--workers", "0"}, "--workers 0: want ≥ 1"},
		{[]string{"--metrics-addr", "bogus"}, `--metrics-addr "bogus"`},
		{[]string{"--metrics-addr", "127.0.0.1:65536"}, `--metrics-addr "127.0.0.1:65536"`},
		{[]string{"--gossip-bind", "127.0.0.1:0", "--autoscale-interval", "0s"}, "--autoscale-interval 0s: want > 0"},
		{[]string{"--gossip-bind", "127.0.0.1:0", "--prometheus-url", "ftp://p"}, `prometheus url "ftp://p"`},
	} {
		err := runOrchestrator(context.Background(), append([]string{"--kubeconfig", "/nonexistent"}, c.args...), io.Discard, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v; want a usage error with %q", c.args, err, c.want)
		}
	}
}

// TestOrchestratorKlogIsJSON: client-go logs through klog (leader
// election's lease messages); in the orchestrator those lines come out
// through its own logger, one JSON object each, not klog's text.
func TestOrchestratorKlogIsJSON(t *testing.T) {
	var buf testutil.SyncBuffer
	prev := klogTarget.Load()
	t.Cleanup(func() { klogTarget.Store(prev) })
	klogToSlog(logutil.New(&buf, logutil.JSON, slog.LevelInfo))
	klog.Infof("attempting to acquire leader lease %s", "kvmesh/x")
	klog.ErrorS(errors.New("refused"), "error retrieving resource lock")
	klog.Flush()
	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	if len(lines) != 2 {
		t.Fatalf("%d lines, want 2: %q", len(lines), buf.String())
	}
	for i, want := range []string{"attempting to acquire leader lease kvmesh/x", "error retrieving resource lock"} {
		var rec map[string]any
		if err := json.Unmarshal([]byte(lines[i]), &rec); err != nil {
			t.Fatalf("line %q is not JSON: %v", lines[i], err)
		}
		if rec["msg"] != want || rec["component"] != "client-go" {
			t.Errorf("line %d: %v; want msg %q from component client-go", i, rec, want)
		}
	}
}

// A bad --log-level is listed with the other problems, by value and with
// the choices, as the other commands do; it stopped the listing with "bad
// --log-level" alone.
func TestOrchestratorListsLogLevelWithOtherProblems(t *testing.T) {
	err := runOrchestrator(context.Background(), []string{"--workers", "0", "--log-level", "loud", "--log-format", "xml"}, io.Discard, io.Discard)
	if !errors.Is(err, errUsage) {
		t.Fatalf("err %v, want a usage error", err)
	}
	for _, want := range []string{`--log-level "loud": want debug, info, warn or error`, "workers", "log-format"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("%v lacks %q", err, want)
		}
	}
}

// `kvmesh orchestrator -h` and `kvmesh help orchestrator` show the local
// mode, whose own flags only `--local FILE -h` lists.
func TestOrchestratorHelpShowsLocal(t *testing.T) {
	for _, args := range [][]string{{"orchestrator", "-h"}, {"help", "orchestrator"}} {
		var out, errOut testutil.SyncBuffer
		if code := run(args, &out, &errOut); code != 0 || !strings.Contains(out.String()+errOut.String(), "-local FILE") ||
			!strings.Contains(out.String()+errOut.String(), "kvmesh orchestrator --local FILE -h") {
			t.Errorf("kvmesh %s: exit %d, want 0 and --local listed:\n%s%s", strings.Join(args, " "), code, out.String(), errOut.String())
		}
	}
}
