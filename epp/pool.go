package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// InferencePoolGVR is the GAIE v1 InferencePool resource.
var InferencePoolGVR = schema.GroupVersionResource{Group: "inference.networking.k8s.io", Version: "v1", Resource: "inferencepools"}

// PoolSpec is the part of an InferencePool v1 the picker reads. It is a
// small local type rather than the upstream Go module
// (sigs.k8s.io/gateway-api-inference-extension), which the module proxy
// here does not serve; the fields follow api/v1/inferencepool_types.go.
type PoolSpec struct {
	Selector    map[string]string // spec.selector.matchLabels
	TargetPorts []int             // spec.targetPorts[].number
	// EndpointPicker names the picker service (spec.endpointPickerRef):
	// informational here (the gateway dials it); FailureMode is the
	// gateway's behaviour when the picker does not answer.
	EndpointPicker, FailureMode string
}

// ErrBadPool is returned for an InferencePool the picker cannot use.
var ErrBadPool = errors.New("bad InferencePool")

// parsePoolSpec reads an InferencePool object's spec, listing every problem.
func parsePoolSpec(obj map[string]any) (PoolSpec, error) {
	var ps PoolSpec
	var probs []string
	sel, _, err := unstructured.NestedStringMap(obj, "spec", "selector", "matchLabels")
	if err != nil {
		probs = append(probs, "spec.selector.matchLabels: "+err.Error())
	}
	if len(sel) == 0 {
		probs = append(probs, "spec.selector.matchLabels is empty")
	}
	ps.Selector = sel
	ports, _, err := unstructured.NestedSlice(obj, "spec", "targetPorts")
	if err != nil {
		probs = append(probs, "spec.targetPorts: "+err.Error())
	}
	for i, p := range ports {
		pm, ok := p.(map[string]any)
		n, found, err := unstructured.NestedInt64(pm, "number")
		if !ok || !found || err != nil || n < 1 || n > 65535 {
			probs = append(probs, fmt.Sprintf("spec.targetPorts[%d].number must be 1-65535", i))
			continue
		}
		ps.TargetPorts = append(ps.TargetPorts, int(n))
	}
	if len(ps.TargetPorts) == 0 {
		probs = append(probs, "spec.targetPorts is empty")
	}
	ps.EndpointPicker, _, _ = unstructured.NestedString(obj, "spec", "endpointPickerRef", "name")
	ps.FailureMode, _, _ = unstructured.NestedString(obj, "spec", "endpointPickerRef", "failureMode")
	if len(probs) > 0 {
		return ps, fmt.Errorf("%w: %v", ErrBadPool, probs)
	}
	return ps, nil
}

// podEndpoints appends a ready pod's endpoints: its IP with every target
// port. A pod not Ready, without an IP or being deleted has none.
func podEndpoints(dst []string, pod *corev1.Pod, ports []int) []string {
	if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" {
		return dst
	}
	ready := false
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			ready = c.Status == corev1.ConditionTrue
		}
	}
	if !ready {
		return dst
	}
	for _, p := range ports {
		if ep, ok := parseEndpoint(net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(p))); ok {
			dst = append(dst, ep)
		}
	}
	return dst
}

// Pool follows one InferencePool and its pods with client-go informers and
// keeps the set of ready endpoints (pod IP × target ports). It implements
// PoolEndpoints; Run owns the informers and the rebuild goroutine.
type Pool struct {
	ns, name string
	dyn      dynamic.Interface
	kube     kubernetes.Interface
	resync   time.Duration
	log      *slog.Logger

	eps    atomic.Pointer[map[string]struct{}]
	spec   atomic.Pointer[PoolSpec]
	synced atomic.Bool
	dirty  chan struct{} // cap 1: a rebuild is due (coalesced)

	// Set by Run before its rebuild loop starts; used only on that goroutine.
	podList func() []*corev1.Pod
	poolGet func() (map[string]any, bool)
}

var _ PoolEndpoints = (*Pool)(nil)

// NewPool follows the InferencePool namespace/name through cfg.
func NewPool(cfg *rest.Config, namespace, name string, log *slog.Logger) (*Pool, error) {
	if namespace == "" || name == "" {
		return nil, fmt.Errorf("%w: namespace and name are required", ErrConfig)
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("pool client: %w", err)
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("pool client: %w", err)
	}
	if log == nil {
		log = slog.Default()
	}
	return &Pool{ns: namespace, name: name, dyn: dyn, kube: kube, resync: 10 * time.Minute,
		log: log.With("component", "epp-pool", "pool", namespace+"/"+name), dirty: make(chan struct{}, 1)}, nil
}

// Has reports whether endpoint is a ready endpoint of the pool.
func (p *Pool) Has(endpoint string) bool {
	m := p.eps.Load()
	if m == nil {
		return false
	}
	_, ok := (*m)[endpoint]
	return ok
}

// Synced reports whether the pool and its pods have been listed once.
func (p *Pool) Synced() bool { return p.synced.Load() }

// Endpoints returns the ready endpoints, sorted.
func (p *Pool) Endpoints() []string {
	m := p.eps.Load()
	if m == nil {
		return nil
	}
	out := make([]string, 0, len(*m))
	for ep := range *m {
		out = append(out, ep)
	}
	sort.Strings(out)
	return out
}

// Spec returns the pool's last good spec (nil before the pool is seen).
func (p *Pool) Spec() *PoolSpec { return p.spec.Load() }

// Run starts the informers, waits for their first list and rebuilds the
// endpoint set on every change until ctx ends. Informer callbacks only mark
// the set dirty; the rebuild runs on Run's goroutine.
func (p *Pool) Run(ctx context.Context) error {
	poolInf := dynamicinformer.NewFilteredDynamicInformer(p.dyn, InferencePoolGVR, p.ns, p.resync, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.name).String()
		}).Informer()
	pods := informers.NewSharedInformerFactoryWithOptions(p.kube, p.resync, informers.WithNamespace(p.ns))
	podInf := pods.Core().V1().Pods()
	mark := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.markDirty() },
		UpdateFunc: func(any, any) { p.markDirty() },
		DeleteFunc: func(any) { p.markDirty() },
	}
	if _, err := poolInf.AddEventHandler(mark); err != nil {
		return fmt.Errorf("pool informer: %w", err)
	}
	if _, err := podInf.Informer().AddEventHandler(mark); err != nil {
		return fmt.Errorf("pod informer: %w", err)
	}
	lister := podInf.Lister()
	p.podList = func() []*corev1.Pod {
		spec := p.spec.Load()
		if spec == nil {
			return nil
		}
		out, _ := lister.Pods(p.ns).List(labels.SelectorFromSet(spec.Selector))
		return out
	}
	p.poolGet = func() (map[string]any, bool) {
		obj, ok, err := poolInf.GetStore().GetByKey(p.ns + "/" + p.name)
		if err != nil || !ok {
			return nil, false
		}
		u, ok := obj.(*unstructured.Unstructured)
		if !ok {
			return nil, false
		}
		return u.Object, true
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); poolInf.Run(ctx.Done()) }()
	go func() { defer wg.Done(); podInf.Informer().Run(ctx.Done()) }()
	defer wg.Wait()
	if !cache.WaitForCacheSync(ctx.Done(), poolInf.HasSynced, podInf.Informer().HasSynced) {
		return ctx.Err()
	}
	p.rebuild()
	p.synced.Store(true)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-p.dirty:
			p.rebuild()
		}
	}
}

func (p *Pool) markDirty() {
	select {
	case p.dirty <- struct{}{}:
	default: // a rebuild is already due; it will see this change too
	}
}

// rebuild recomputes the endpoint set from the informers' stores.
func (p *Pool) rebuild() {
	obj, ok := p.poolGet()
	if !ok {
		p.spec.Store(nil)
		p.eps.Store(&map[string]struct{}{})
		p.log.Warn("InferencePool not found: no endpoints")
		return
	}
	spec, err := parsePoolSpec(obj)
	if err != nil {
		// Keep the last good spec: a bad edit should not empty the pool.
		p.log.Error("InferencePool rejected; keeping the last good spec", "err", err)
	} else {
		p.spec.Store(&spec)
	}
	cur := p.spec.Load()
	if cur == nil {
		p.eps.Store(&map[string]struct{}{})
		return
	}
	m := map[string]struct{}{}
	var buf []string
	for _, pod := range p.podList() {
		buf = podEndpoints(buf[:0], pod, cur.TargetPorts)
		for _, ep := range buf {
			m[ep] = struct{}{}
		}
	}
	p.eps.Store(&m)
	p.log.Debug("pool endpoints", "ready", len(m))
}
