package manifests

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/webhook"
)

// source is where a connection comes from: a pod (its labels and its
// namespace's), or an address that is no pod: a client outside the cluster,
// the API server, or a node, which is how most network plugins see a
// hostNetwork pod's traffic (Kubernetes leaves those pods to the plugin; the
// common case matches them by no pod or namespace selector).
type source struct {
	name     string
	pod      *corev1.Pod
	nsLabels map[string]string
	ip       net.IP
}

func podSource(name string, p *corev1.Pod, nsLabels map[string]string) source {
	if p.Spec.HostNetwork {
		return source{name: name, ip: net.ParseIP(nodeIP)}
	}
	return source{name: name, pod: p, nsLabels: nsLabels}
}

// nodeIP is a node's address inside the documentation CIDR that
// overlays/daemonset's policies hold until the operator sets the nodes' own.
const nodeIP = "192.0.2.10"

// policies evaluates NetworkPolicies (ingress) as the API defines them.
type policies []networkingv1.NetworkPolicy

func selects(sel *metav1.LabelSelector, l map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(sel)
	return err == nil && s.Matches(labels.Set(l))
}

// allows reports whether from may connect to dst on port/proto: dst is not
// isolated (no policy of its namespace selects it for ingress), or a rule of
// a policy that selects it admits both the source and the port.
func (ps policies) allows(from source, dst *corev1.Pod, port int32, proto corev1.Protocol) bool {
	isolated := false
	for _, p := range ps {
		if p.Namespace != dst.Namespace || !selects(&p.Spec.PodSelector, dst.Labels) || !slices.Contains(p.Spec.PolicyTypes, networkingv1.PolicyTypeIngress) {
			continue
		}
		isolated = true
		for _, r := range p.Spec.Ingress {
			if admitsPeer(p.Namespace, r.From, from) && admitsPort(r.Ports, dst, port, proto) {
				return true
			}
		}
	}
	return !isolated
}

func admitsPeer(policyNS string, peers []networkingv1.NetworkPolicyPeer, from source) bool {
	if len(peers) == 0 {
		return true
	}
	for _, pr := range peers {
		if pr.IPBlock != nil {
			if from.ip == nil {
				continue // pod IPs are left to the plugin: not counted on
			}
			_, cidr, err := net.ParseCIDR(pr.IPBlock.CIDR)
			if err != nil || !cidr.Contains(from.ip) {
				continue
			}
			excepted := false
			for _, e := range pr.IPBlock.Except {
				if _, ex, err := net.ParseCIDR(e); err == nil && ex.Contains(from.ip) {
					excepted = true
				}
			}
			if !excepted {
				return true
			}
			continue
		}
		if from.pod == nil {
			continue
		}
		nsOK := from.pod.Namespace == policyNS
		if pr.NamespaceSelector != nil {
			nsOK = selects(pr.NamespaceSelector, from.nsLabels)
		}
		podOK := pr.PodSelector == nil || selects(pr.PodSelector, from.pod.Labels)
		if nsOK && podOK {
			return true
		}
	}
	return false
}

func admitsPort(ports []networkingv1.NetworkPolicyPort, dst *corev1.Pod, port int32, proto corev1.Protocol) bool {
	if len(ports) == 0 {
		return true
	}
	for _, pp := range ports {
		p := corev1.ProtocolTCP
		if pp.Protocol != nil {
			p = *pp.Protocol
		}
		if p != proto {
			continue
		}
		if pp.Port == nil {
			return true
		}
		n := pp.Port.IntValue()
		if pp.Port.StrVal != "" {
			// A named port is the port of that name in the pod's containers
			// (not its init containers: plugins differ on native sidecars).
			n = 0
			for _, c := range dst.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name == pp.Port.StrVal && cp.Protocol == proto {
						n = int(cp.ContainerPort)
					}
				}
			}
		}
		end := n
		if pp.EndPort != nil {
			end = int(*pp.EndPort)
		}
		if n != 0 && int(port) >= n && int(port) <= end {
			return true
		}
	}
	return false
}

// declaredPorts are the ports the pod's containers and native sidecars declare.
func declaredPorts(p *corev1.Pod) []corev1.ContainerPort {
	var out []corev1.ContainerPort
	for _, c := range slices.Concat(p.Spec.InitContainers, p.Spec.Containers) {
		for _, cp := range c.Ports {
			if cp.Protocol == "" {
				cp.Protocol = corev1.ProtocolTCP
			}
			out = append(out, cp)
		}
	}
	return out
}

func render(t *testing.T, kc, dir string) []*unstructured.Unstructured {
	t.Helper()
	out, err := exec.Command(kc, "kustomize", dir).Output()
	if err != nil {
		t.Fatalf("kubectl kustomize %s: %v", dir, err)
	}
	objs, err := kubetest.Decode(bytes.NewReader(out))
	if err != nil {
		t.Fatal(err)
	}
	return objs
}

func find(t *testing.T, objs []*unstructured.Unstructured, kind, name string) *unstructured.Unstructured {
	t.Helper()
	for _, o := range objs {
		if o.GetKind() == kind && o.GetName() == name {
			return o
		}
	}
	t.Fatalf("no %s %s rendered", kind, name)
	return nil
}

// templatePod is the pod a workload's controller would make from its template.
func templatePod(t *testing.T, o *unstructured.Unstructured, ns string) *corev1.Pod {
	t.Helper()
	tm, _, _ := unstructured.NestedMap(o.Object, "spec", "template")
	var tmpl corev1.PodTemplateSpec
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tm, &tmpl); err != nil {
		t.Fatal(err)
	}
	p := &corev1.Pod{ObjectMeta: tmpl.ObjectMeta, Spec: tmpl.Spec}
	p.Name, p.Namespace = o.GetName()+"-0", ns
	claims, _, _ := unstructured.NestedSlice(o.Object, "spec", "volumeClaimTemplates")
	for _, c := range claims { // a StatefulSet's pod mounts its claims as the controller names them
		name, _, _ := unstructured.NestedString(c.(map[string]any), "metadata", "name")
		p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: name, VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: name + "-" + p.Name}}})
	}
	return p
}

// TestNetworkPoliciesAllowWhatEachPodNeeds renders the manifests, applies
// their NetworkPolicies to a real API server and evaluates them against the
// pods kvmesh runs as the API server stores them: the workloads' pods
// (server-side dry run of their templates), an engine pod whose sidecar the
// real webhook injects (in the kvmesh namespace and in a team's), and the pods
// the real orchestrator makes from the P/D and multi-node ModelDeployment
// examples. Every flow each pod needs is allowed, and a pod or address with
// none of kvmesh's labels reaches nothing but the ingress's API port and the
// orchestrator's webhook.
func TestNetworkPoliciesAllowWhatEachPodNeeds(t *testing.T) {
	srv := kubetest.Shared(t)
	kc := kubectl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(srv.Config)
	crds, _ := filepath.Glob(filepath.Join("crds", "kvmesh.io_*.yaml"))
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, crds...); err != nil {
		t.Fatal(err)
	}
	ns := srv.Namespace(t)    // plays kvmesh
	team := srv.Namespace(t)  // an engine team's namespace
	monNS := srv.Namespace(t) // where Prometheus runs
	nsLabels := map[string]map[string]string{ns: nil, team: nil, monNS: {"kvmesh.io/monitoring": "true"}}
	mon, err := kube.CoreV1().Namespaces().Get(ctx, monNS, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	mon.Labels = nsLabels[monNS]
	if _, err := kube.CoreV1().Namespaces().Update(ctx, mon, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}

	install := render(t, kc, "install")
	injectedOverlay := render(t, kc, filepath.Join("overlays", "injected")) // install + the example engine
	daemonset := render(t, kc, filepath.Join("overlays", "daemonset"))
	container := render(t, kc, filepath.Join("overlays", "sidecar-container"))

	// The policies of every mode (base's, and the daemonset overlay's), stored for real.
	var npObjs []*unstructured.Unstructured
	for _, o := range slices.Concat(install, daemonset, container) {
		if o.GetKind() == "NetworkPolicy" && !slices.ContainsFunc(npObjs, func(n *unstructured.Unstructured) bool { return n.GetName() == o.GetName() }) {
			o.SetNamespace(ns)
			npObjs = append(npObjs, o)
		}
	}
	if err := kubetest.Apply(ctx, srv.Config, kubetest.ApplyOptions{Namespace: ns}, npObjs...); err != nil {
		t.Fatal(err)
	}
	stored, err := kube.NetworkingV1().NetworkPolicies(ns).List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ps := policies(stored.Items)
	for _, np := range ps {
		for _, r := range np.Spec.Ingress {
			for _, pr := range r.From {
				if pr.IPBlock != nil && (pr.IPBlock.CIDR == "0.0.0.0/0" || pr.IPBlock.CIDR == "::/0") {
					t.Errorf("policy %s admits every address", np.Name)
				}
			}
		}
	}

	// The workloads' pods, as the API server stores them (dry run; their service accounts for real).
	var sas []*unstructured.Unstructured
	for _, o := range slices.Concat(install, daemonset) {
		if o.GetKind() == "ServiceAccount" && !slices.ContainsFunc(sas, func(n *unstructured.Unstructured) bool { return n.GetName() == o.GetName() }) {
			o.SetNamespace(ns)
			sas = append(sas, o)
		}
	}
	if err := kubetest.Apply(ctx, srv.Config, kubetest.ApplyOptions{Namespace: ns}, sas...); err != nil {
		t.Fatal(err)
	}
	dryRun := func(p *corev1.Pod) *corev1.Pod {
		t.Helper()
		got, err := kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if err != nil {
			t.Fatalf("pod of %s: %v", p.Name, err)
		}
		return got
	}
	ingress := dryRun(templatePod(t, find(t, install, "Deployment", "kvmesh-ingress"), ns))
	orch := dryRun(templatePod(t, find(t, install, "Deployment", "kvmesh-orchestrator"), ns))
	nats := dryRun(templatePod(t, find(t, install, "StatefulSet", "nats"), ns))
	bootstrap := dryRun(templatePod(t, find(t, install, "Job", "kvmesh-bootstrap"), ns))
	dsPod := dryRun(templatePod(t, find(t, daemonset, "DaemonSet", "kvmesh-sidecar"), ns))
	written := dryRun(templatePod(t, find(t, container, "Deployment", "vllm-llama3-8b"), ns))

	// The real webhook injects the sidecar into the injected overlay's example engine.
	certs, err := webhook.GenerateCerts("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	whs, err := webhook.Listen("127.0.0.1:0", certs.Cert, &webhook.Handler{Sidecar: webhook.DefaultSidecarConfig()})
	if err != nil {
		t.Fatal(err)
	}
	wctx, stopWebhook := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- whs.Serve(wctx) }()
	t.Cleanup(func() { stopWebhook(); <-served })
	if err := webhook.Ensure(ctx, kube, webhook.Target{URL: "https://" + whs.Addr() + webhook.Path}, certs.CABundle); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), webhook.ConfigName, metav1.DeleteOptions{})
	})
	engineTmpl := templatePod(t, find(t, injectedOverlay, "Deployment", "vllm-llama3-8b"), ns)
	testutil.WaitFor(t, time.Minute, "the API server to call the webhook", func() bool {
		p, err := kube.CoreV1().Pods(ns).Create(ctx, engineTmpl, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && len(p.Spec.InitContainers) == 1
	})
	create := func(p *corev1.Pod) *corev1.Pod {
		t.Helper()
		got, err := kube.CoreV1().Pods(p.Namespace).Create(ctx, p, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if len(got.Spec.InitContainers) != 1 || got.Spec.InitContainers[0].Name != webhook.ContainerName {
			t.Fatalf("%s/%s: the webhook did not inject the sidecar", got.Namespace, got.Name)
		}
		return got
	}
	injected := create(engineTmpl)
	teamTmpl := engineTmpl.DeepCopy()
	teamTmpl.Namespace = team
	injectedTeam := create(teamTmpl)

	// The real orchestrator makes the examples' pods (the webhook injects their leaders).
	cfg := orchestrator.DefaultConfig()
	cfg.Namespace, cfg.LeaderElection = ns, false
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctrl, err := orchestrator.New(srv.Config, cfg)
	if err != nil {
		t.Fatal(err)
	}
	cctx, stopCtrl := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- ctrl.Run(cctx) }()
	t.Cleanup(func() {
		stopCtrl()
		if err := <-ran; err != nil {
			t.Errorf("controller: %v", err)
		}
	})
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{Namespace: ns},
		filepath.Join("..", "examples", "pd-modeldeployment.yaml"), filepath.Join("..", "examples", "multinode-modeldeployment.yaml")); err != nil {
		t.Fatal(err)
	}
	mdPod := map[string]*corev1.Pod{}
	testutil.WaitFor(t, 2*time.Minute, "the orchestrator's pods of both examples", func() bool {
		l, err := kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelDeployment})
		if err != nil {
			return false
		}
		for i := range l.Items {
			p := &l.Items[i]
			mdPod[p.Labels[v1alpha1.LabelDeployment]+"/"+p.Labels[v1alpha1.LabelRole]+"/w"+p.Labels[v1alpha1.LabelWorker]] = p
		}
		return len(l.Items) == 6
	})
	prefill, decode := mdPod["llama-pd/prefill/w0"], mdPod["llama-pd/decode/w0"]
	leader, worker := mdPod["llama-70b/engine/w0"], mdPod["llama-70b/engine/w1"]
	if prefill == nil || decode == nil || leader == nil || worker == nil {
		t.Fatalf("pods %v", mdPod)
	}
	for _, p := range []*corev1.Pod{prefill, decode, leader} {
		if len(p.Spec.InitContainers) != 1 {
			t.Errorf("%s: the leader's sidecar was not injected", p.Name)
		}
	}

	src := func(name string, p *corev1.Pod) source { return podSource(name, p, nsLabels[p.Namespace]) }
	monitoring := src("monitoring", &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "prometheus-0", Namespace: monNS, Labels: map[string]string{"app.kubernetes.io/name": "prometheus"}}})
	type dest struct {
		name string
		pod  *corev1.Pod
	}
	type flow struct {
		from  source
		to    dest
		port  int32
		proto corev1.Protocol
	}
	enginePort := func(p *corev1.Pod) int32 {
		if v, ok := p.Annotations[webhook.AnnotationEnginePort]; ok {
			n, _ := strconv.Atoi(v)
			return int32(n)
		}
		return 8000
	}
	var needs []flow
	tcp := func(from source, to dest, port int32) {
		needs = append(needs, flow{from, to, port, corev1.ProtocolTCP})
	}
	// Mesh members: who gossips (every one with every other) and who uses NATS.
	members := []struct {
		src  source
		dst  *corev1.Pod // nil: not a destination the policies govern (hostNetwork)
		nats bool
	}{
		{src("ingress", ingress), ingress, true},
		{src("orchestrator", orch), orch, false},
		{src("sidecar DaemonSet (node address)", dsPod), nil, true},
		{src("sidecar written in", written), written, true},
		{src("injected engine", injected), injected, true},
		{src("injected engine, team namespace", injectedTeam), injectedTeam, true},
		{src("ModelDeployment prefill", prefill), prefill, true},
		{src("ModelDeployment decode", decode), decode, true},
		{src("ModelDeployment multi-node leader", leader), leader, true},
	}
	if !dsPod.Spec.HostNetwork {
		t.Error("the sidecar DaemonSet is not in the node's network: revisit its source here")
	}
	for _, m := range members {
		if m.nats {
			tcp(m.src, dest{"NATS", nats}, 4222)
		}
		for _, o := range members {
			if o.dst != nil && o.src.name != m.src.name {
				tcp(m.src, dest{o.src.name, o.dst}, 7946)
				needs = append(needs, flow{m.src, dest{o.src.name, o.dst}, 7946, corev1.ProtocolUDP})
			}
		}
	}
	tcp(src("NATS", nats), dest{"NATS", nats}, 6222)
	tcp(source{name: "client", ip: net.ParseIP("203.0.113.7")}, dest{"ingress", ingress}, 8000)
	tcp(source{name: "API server", ip: net.ParseIP("198.51.100.1")}, dest{"orchestrator", orch}, 9443)
	// The ingress proxies to every engine; engines of a deployment talk among themselves.
	for _, e := range []dest{{"injected engine", injected}, {"sidecar written in", written}, {"ModelDeployment prefill", prefill},
		{"ModelDeployment decode", decode}, {"ModelDeployment multi-node leader", leader}} {
		tcp(src("ingress", ingress), e, enginePort(e.pod))
		for _, cp := range declaredPorts(e.pod) {
			if cp.Name == "http" { // the engines' PodMonitor scrapes that port
				tcp(monitoring, e, cp.ContainerPort)
			}
		}
		tcp(monitoring, e, 9101) // the sidecar's kvmesh-admin
	}
	tcp(src("ModelDeployment decode", decode), dest{"ModelDeployment prefill", prefill}, 5600) // NIXL side channel
	tcp(src("multi-node worker", worker), dest{"multi-node leader", leader}, 5000)             // the example's --dist-init-addr
	tcp(src("multi-node leader", leader), dest{"multi-node worker", worker}, 29500)
	tcp(monitoring, dest{"ingress", ingress}, 9090)
	tcp(monitoring, dest{"NATS", nats}, 8222)
	tcp(monitoring, dest{"orchestrator", orch}, 9102)
	for _, f := range needs {
		if !ps.allows(f.from, f.to.pod, f.port, f.proto) {
			t.Errorf("%s → %s :%d/%s is denied", f.from.name, f.to.name, f.port, f.proto)
		}
	}

	// Nothing else is open to all: a pod without kvmesh's labels (here or in
	// another namespace) or an outside address reaches only the API and the webhook.
	open := map[string]bool{"ingress:8000/TCP": true, "orchestrator:9443/TCP": true}
	strangers := []source{
		{name: "unlabelled pod, other namespace", pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: team, Labels: map[string]string{"app": "x"}}}},
		{name: "unlabelled pod, kvmesh namespace", pod: &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Labels: map[string]string{"app": "x"}}}},
		{name: "outside address", ip: net.ParseIP("203.0.113.7")},
	}
	for _, d := range []dest{{"ingress", ingress}, {"orchestrator", orch}, {"NATS", nats}, {"bootstrap", bootstrap},
		{"sidecar written in", written}, {"injected engine", injected}, {"ModelDeployment prefill", prefill},
		{"ModelDeployment decode", decode}, {"multi-node leader", leader}, {"multi-node worker", worker}} {
		ports := append(declaredPorts(d.pod), corev1.ContainerPort{ContainerPort: 5600, Protocol: corev1.ProtocolTCP},
			corev1.ContainerPort{ContainerPort: 29500, Protocol: corev1.ProtocolTCP})
		for _, s := range strangers {
			for _, cp := range ports {
				key := fmt.Sprintf("%s:%d/%s", d.name, cp.ContainerPort, cp.Protocol)
				if ps.allows(s, d.pod, cp.ContainerPort, cp.Protocol) && !open[key] {
					t.Errorf("%s reaches %s", s.name, key)
				}
			}
		}
	}
	// Every pod with a metrics port is scraped, once, by the monitoring
	// PodMonitors (the Prometheus Operator selects pods by one label selector each).
	var monitors []*unstructured.Unstructured
	for _, o := range render(t, kc, "monitoring") {
		if o.GetKind() == "PodMonitor" {
			monitors = append(monitors, o)
		}
	}
	for _, d := range []dest{{"ingress", ingress}, {"orchestrator", orch}, {"sidecar written in", written}, {"sidecar DaemonSet", dsPod},
		{"injected engine", injected}, {"injected engine, team namespace", injectedTeam}, {"ModelDeployment prefill", prefill},
		{"ModelDeployment decode", decode}, {"multi-node leader", leader}} {
		for _, cp := range declaredPorts(d.pod) {
			if cp.Name != "kvmesh-admin" && cp.Name != "admin" && cp.Name != "metrics" {
				continue
			}
			var by []string
			for _, m := range monitors {
				var spec struct {
					Selector          metav1.LabelSelector `json:"selector"`
					NamespaceSelector struct {
						Any bool `json:"any"`
					} `json:"namespaceSelector"`
					PodMetricsEndpoints []struct {
						Port string `json:"port"`
					} `json:"podMetricsEndpoints"`
				}
				raw, _ := m.Object["spec"].(map[string]any)
				if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &spec); err != nil {
					t.Fatalf("PodMonitor %s: %v", m.GetName(), err)
				}
				if (!spec.NamespaceSelector.Any && d.pod.Namespace != ns) || !selects(&spec.Selector, d.pod.Labels) {
					continue
				}
				for _, e := range spec.PodMetricsEndpoints {
					if e.Port == cp.Name {
						by = append(by, m.GetName())
					}
				}
			}
			if len(by) != 1 {
				t.Errorf("%s's port %s is scraped by %v, want exactly one PodMonitor", d.name, cp.Name, by)
			}
		}
	}
}
