package orchestrator

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	clientscheme "k8s.io/client-go/kubernetes/scheme"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/client-go/tools/record"
	"k8s.io/client-go/util/workqueue"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/modelroutes"
)

// Controller reconciles ModelDeployments into pods and RoleScalers.
type Controller struct {
	cfg     Config
	log     *slog.Logger
	restCfg *rest.Config // the controller's: fenced under leader election
	kube    kubernetes.Interface
	dyn     dynamic.Interface
	// leaseKube writes the Lease: the API server's config as given, so the
	// fence never stands in the way of the renewal that keeps it open.
	leaseKube kubernetes.Interface
	// fence is the current term's (nil between terms, and without leader
	// election); fencedTransport and processNext read it.
	fence atomic.Pointer[fence]
	// clock is the fence's (tests step a fake one); wrapLock, when set,
	// wraps the Lease lock (tests block its renewals). Both are set before
	// Run.
	clock    fenceClock
	wrapLock func(resourcelock.Interface) resourcelock.Interface

	// The fields below are one term's (newTerm builds them before the
	// term's run starts, which is their only user).
	queue         workqueue.TypedRateLimitingInterface[string]
	kubeInformers informers.SharedInformerFactory
	dynInformers  dynamicinformer.DynamicSharedInformerFactory
	pods          corelisters.PodLister
	services      corelisters.ServiceLister
	mds           cache.GenericLister
	scalers       cache.GenericLister
	policies      cache.GenericLister
	synced        []cache.InformerSynced
	// volcano is set once in run, before the workers start.
	volcano bool
	// autoscalers is owned by the autoscaler goroutine alone.
	autoscalers map[types.UID]*policyEntry
	// promClients and promBackoff by address, owned by the goroutine
	// running a step's Prometheus queries (runPromJobs).
	promClients map[string]*promClient
	promBackoff map[string]*promBackoff
	// series are the per-role metric series the last step exported (the
	// autoscaler goroutine's; withdrawn when its term ends).
	series map[seriesKey]bool

	recorder    record.EventRecorder
	broadcaster record.EventBroadcaster
	// mdGens are the generations of the deployments' spec writes the
	// informer cache has not shown yet (see generations).
	mdGens *generations
	// scalerGens are the generations of the controller's own RoleScaler
	// spec writes their status has not shown yet (generations.ours): a
	// scaler at such a generation was not scaled by anyone else.
	scalerGens *generations
	// held remembers the names other objects hold (see heldNames).
	held *heldNames
	// heldRequeue is nameHeldRequeue (a test shortens it).
	heldRequeue time.Duration
	// routes renders ModelRoutes into route files (nil: off); run owns its
	// goroutine, so it too runs on the leader alone.
	routes *modelroutes.Controller
}

// Scheme holds client-go's types and kvmesh.io/v1alpha1 (for events).
var Scheme = func() *runtime.Scheme {
	s := runtime.NewScheme()
	_ = clientscheme.AddToScheme(s)
	_ = v1alpha1.AddToScheme(s)
	return s
}()

// New builds a controller; Run starts it.
func New(restCfg *rest.Config, cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("orchestrator config: %w", err)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if s, ok := cfg.Load.(SLOSource); ok && cfg.SLO == nil {
		cfg.SLO = s
	}
	c := &Controller{cfg: cfg, log: cfg.Logger, restCfg: restCfg, clock: realClock{}, heldRequeue: nameHeldRequeue}
	var err error
	if c.leaseKube, err = kubernetes.NewForConfig(restCfg); err != nil {
		return nil, err
	}
	if cfg.LeaderElection {
		c.restCfg = rest.CopyConfig(restCfg)
		c.restCfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
			return &fencedTransport{rt: rt, fence: c.fence.Load}
		})
	}
	if c.kube, err = kubernetes.NewForConfig(c.restCfg); err != nil {
		return nil, err
	}
	if c.dyn, err = dynamic.NewForConfig(c.restCfg); err != nil {
		return nil, err
	}
	if err := c.newTerm(); err != nil {
		return nil, err
	}
	return c, nil
}

// newTerm builds what one term of leadership owns and ends with: the work
// queue, the informers and their caches, the event broadcaster, the
// ModelRoute controller and the autoscalers' state. None of them can be
// started twice, and a new leader must not act on what an old term's
// caches held (runElected).
func (c *Controller) newTerm() error {
	cfg := c.cfg
	c.queue = workqueue.NewTypedRateLimitingQueueWithConfig(newRateLimiter(),
		workqueue.TypedRateLimitingQueueConfig[string]{Name: "modeldeployments"})
	c.kubeInformers = informers.NewSharedInformerFactoryWithOptions(c.kube, cfg.Resync,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = v1alpha1.LabelDeployment }))
	c.dynInformers = dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.dyn, cfg.Resync, cfg.Namespace, nil)
	c.mdGens, c.scalerGens, c.held = &generations{}, &generations{}, &heldNames{}
	c.volcano = false

	podInf := c.kubeInformers.Core().V1().Pods()
	svcInf := c.kubeInformers.Core().V1().Services()
	mdInf := c.dynInformers.ForResource(v1alpha1.ModelDeploymentsResource)
	scInf := c.dynInformers.ForResource(v1alpha1.RoleScalersResource)
	c.pods, c.services, c.mds, c.scalers = podInf.Lister(), svcInf.Lister(), mdInf.Lister(), scInf.Lister()
	c.synced = []cache.InformerSynced{podInf.Informer().HasSynced, svcInf.Informer().HasSynced, mdInf.Informer().HasSynced, scInf.Informer().HasSynced}
	// Policies are listed without a load source too, to say on each that
	// it is not run (runAutoscalerDisabled).
	apInf := c.dynInformers.ForResource(v1alpha1.AutoscalingPoliciesResource)
	c.policies = apInf.Lister()
	c.synced = append(c.synced, apInf.Informer().HasSynced)
	c.autoscalers, c.promClients, c.promBackoff = nil, nil, nil
	if cfg.Load != nil {
		c.autoscalers = map[types.UID]*policyEntry{}
	}

	handlers := []struct {
		inf cache.SharedIndexInformer
		key func(obj any) (string, bool)
	}{
		{mdInf.Informer(), objectKey},
		{podInf.Informer(), labelKey},
		{svcInf.Informer(), serviceKey},
		{scInf.Informer(), scalerKey},
	}
	for _, h := range handlers {
		key := h.key
		if _, err := h.inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    func(o any) { c.enqueue(key, o) },
			UpdateFunc: func(_, o any) { c.enqueue(key, o) },
			DeleteFunc: func(o any) { c.enqueue(key, o) },
		}); err != nil {
			return err
		}
	}
	// A RoleScaler that goes brings back, besides the deployment its spec
	// names, the deployments whose RoleScaler name it held.
	if _, err := scInf.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		DeleteFunc: func(o any) {
			if d, ok := o.(cache.DeletedFinalStateUnknown); ok {
				o = d.Obj
			}
			for _, k := range c.scalerNameKeys(o) {
				c.queue.Add(k)
			}
		},
	}); err != nil {
		return err
	}
	c.routes = nil
	if cfg.RouteConfigMap != "" {
		rc := modelroutes.DefaultConfig()
		rc.Namespace, rc.ConfigMap, rc.Resync, rc.Logger = cfg.Namespace, cfg.RouteConfigMap, cfg.Resync, cfg.Logger
		var err error
		if c.routes, err = modelroutes.New(c.restCfg, rc); err != nil {
			return err
		}
	}
	c.broadcaster = record.NewBroadcaster()
	c.recorder = c.broadcaster.NewRecorder(Scheme, corev1.EventSource{Component: "kvmesh-orchestrator"})
	return nil
}

func (c *Controller) enqueue(key func(any) (string, bool), obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if k, ok := key(obj); ok {
		c.queue.Add(k)
	}
}

func objectKey(obj any) (string, bool) {
	k, err := cache.MetaNamespaceKeyFunc(obj)
	return k, err == nil
}

// labelKey is the deployment a pod's label names, else the one its
// controller owner reference names: a pod relabelled away from its
// deployment leaves the informer (its selector) as a deletion that still
// brings its owner back, which then releases it (nameTaken).
func labelKey(obj any) (string, bool) {
	p, ok := obj.(*corev1.Pod)
	if !ok {
		return "", false
	}
	if d := p.Labels[v1alpha1.LabelDeployment]; d != "" {
		return p.Namespace + "/" + d, true
	}
	if ref := metav1.GetControllerOf(p); ref != nil && ref.Kind == "ModelDeployment" && ref.APIVersion == v1alpha1.SchemeGroupVersion.String() {
		return p.Namespace + "/" + ref.Name, true
	}
	return "", false
}

// serviceKey is the deployment a headless Service belongs to: the informer
// lists only Services with the deployment label, so a Service deleted by
// hand brings its deployment back to be recreated.
func serviceKey(obj any) (string, bool) {
	svc, ok := obj.(*corev1.Service)
	if !ok {
		return "", false
	}
	if d := svc.Labels[v1alpha1.LabelDeployment]; d != "" {
		return svc.Namespace + "/" + d, true
	}
	return "", false
}

func scalerKey(obj any) (string, bool) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return "", false
	}
	d, _, _ := unstructured.NestedString(u.Object, "spec", "deployment")
	if d == "" {
		return "", false
	}
	return u.GetNamespace() + "/" + d, true
}

// scalerNameKeys are the deployments whose RoleScaler name <md>-<role> a
// RoleScaler's name could be, whatever its spec names: one that held such
// a name (RoleScalerConflict) brings that deployment back when it goes or
// changes, to create its own. Only deployments the cache holds are named.
func (c *Controller) scalerNameKeys(obj any) []string {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	var keys []string
	name := u.GetName()
	for i := strings.IndexByte(name, '-'); i > 0; {
		if _, err := c.mds.ByNamespace(u.GetNamespace()).Get(name[:i]); err == nil {
			keys = append(keys, u.GetNamespace()+"/"+name[:i])
		}
		j := strings.IndexByte(name[i+1:], '-')
		if j < 0 {
			break
		}
		i += 1 + j
	}
	return keys
}

// Run runs the controller until ctx ends, with leader election when
// configured. It returns after every worker and informer has stopped.
func (c *Controller) Run(ctx context.Context) error {
	if !c.cfg.LeaderElection {
		return c.run(ctx)
	}
	return c.runElected(ctx)
}

// run starts informers and workers and blocks until ctx ends.
func (c *Controller) run(ctx context.Context) error {
	defer c.queue.ShutDown()
	c.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: c.kube.CoreV1().Events("")})
	defer c.broadcaster.Shutdown()
	c.kubeInformers.Start(ctx.Done())
	c.dynInformers.Start(ctx.Done())
	defer c.kubeInformers.Shutdown()
	defer c.dynInformers.Shutdown()
	syncCtx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	if !cache.WaitForCacheSync(syncCtx.Done(), c.synced...) {
		if ctx.Err() != nil {
			return nil // stopped before the caches synced
		}
		return fmt.Errorf("orchestrator: informer caches did not sync: %w", syncCtx.Err())
	}
	c.volcano = c.detectVolcano()
	c.log.Info("orchestrator running", "namespace", c.cfg.Namespace, "workers", c.cfg.Workers, "volcanoPodGroups", c.volcano)
	var wg sync.WaitGroup
	if c.cfg.Load != nil {
		wg.Go(func() { c.runAutoscaler(ctx) })
	} else {
		wg.Go(func() { c.runAutoscalerDisabled(ctx) })
	}
	if c.routes != nil {
		wg.Go(func() {
			if err := c.routes.Run(ctx); err != nil {
				c.log.Error("model routes stopped", "err", err)
			}
		})
	}
	for range c.cfg.Workers {
		wg.Go(func() {
			for c.processNext(ctx) {
			}
		})
	}
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

// leaseInvalid reports, under leader election, a term whose fence is
// closed: the check is made before each work item, so workers stop at once
// rather than at their first write.
func (c *Controller) leaseInvalid() bool {
	if !c.cfg.LeaderElection {
		return false
	}
	f := c.fence.Load()
	return f == nil || f.check() != nil
}

func (c *Controller) processNext(ctx context.Context) bool {
	key, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(key)
	if c.leaseInvalid() {
		// The term is ending (the fence closed, which cancels it): its queue
		// goes with it, and the next term starts from a fresh one.
		return false
	}
	requeue, err := c.reconcile(ctx, key)
	switch {
	case err != nil:
		reconcileErrors.Inc()
		c.log.Warn("reconcile", "key", key, "err", err)
		c.queue.AddRateLimited(key)
	case requeue > 0:
		c.queue.Forget(key)
		c.queue.AddAfter(key, requeue)
	default:
		c.queue.Forget(key)
	}
	reconciles.Inc()
	return true
}

// maxBackoff caps how long a failing deployment waits before its next
// try. client-go's default limiter doubles up to 1000 s: a failure whose
// end sends the deployment no event (a sidecar webhook down under
// failurePolicy Fail, so every gang create fails; an API server refusing
// for a while) would leave its pods uncreated for up to ~16 min after the
// cause went. A minute costs at most one attempt per deployment a minute.
const maxBackoff = time.Minute

// newRateLimiter is client-go's controller limiter (per-item exponential
// from 5 ms, and 10 retries a second overall) with each delay capped at
// maxBackoff.
func newRateLimiter() workqueue.TypedRateLimiter[string] {
	return cappedLimiter{workqueue.DefaultTypedControllerRateLimiter[string](), maxBackoff}
}

type cappedLimiter struct {
	workqueue.TypedRateLimiter[string]
	max time.Duration
}

func (l cappedLimiter) When(item string) time.Duration {
	return min(l.TypedRateLimiter.When(item), l.max)
}
