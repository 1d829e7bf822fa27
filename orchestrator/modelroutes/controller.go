// Package modelroutes renders ModelRoutes into the ingresses' route file.
//
// The ingress reads its model routes from a RouteConfig file it hot-reloads
// (ingress/routes, docs/REQUESTS.md). On Kubernetes that file is a key of a
// ConfigMap mounted into the ingress pods; this controller writes it: for
// each namespace, the namespace's ModelRoutes are validated one by one with
// the ingress's own rules, the valid ones ordered (priority, higher first,
// then name) and written as one RouteConfig into the ConfigMap (default
// kvmesh-routes, key routes.yaml) of that namespace. Each ModelRoute's status
// says whether it is valid (Accepted), whether it is in the file
// (Programmed) and at which position. An invalid route never reaches the
// file, so one bad object cannot stop the others or the ingresses (which
// keep their previous routes on a bad file anyway).
//
// The controller is level-triggered on namespaces: any change to a
// namespace's ModelRoutes or to its ConfigMap queues the namespace, and a
// reconcile recomputes the file from the whole list. It writes only a
// ConfigMap it manages (labelled app.kubernetes.io/managed-by:
// kvmesh-orchestrator); a user's ConfigMap of the same name is left alone and
// the routes say so.
package modelroutes

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// Label values of the ConfigMap the controller manages.
const (
	LabelManagedBy = "app.kubernetes.io/managed-by"
	ManagedBy      = "kvmesh-orchestrator"
)

// Config configures the controller. Start from DefaultConfig.
type Config struct {
	// Namespace limits the controller to one namespace ("" watches all).
	Namespace string
	// ConfigMap is the name of the ConfigMap written in each namespace with
	// ModelRoutes (default kvmesh-routes); Key is its data key (default
	// routes.yaml), the file the ingress's --routes names.
	ConfigMap, Key string
	// Resync re-lists the informers' caches this often (default 10 min).
	Resync time.Duration
	// CRDRecheck is how often the ModelRoute CRD is looked for again while
	// the API server does not serve it (default 30 s): installing it later
	// turns the controller on without a restart.
	CRDRecheck time.Duration
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
}

// DefaultConfig is the production configuration.
func DefaultConfig() Config {
	return Config{ConfigMap: "kvmesh-routes", Key: "routes.yaml", Resync: 10 * time.Minute, CRDRecheck: 30 * time.Second}
}

// Validate lists every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if c.ConfigMap == "" || c.Key == "" {
		errs = append(errs, errors.New("modelroutes: configMap and key are required"))
	}
	if c.Resync < 0 || c.CRDRecheck <= 0 {
		errs = append(errs, errors.New("modelroutes: resync must be ≥ 0 and crdRecheck > 0"))
	}
	return errors.Join(errs...)
}

// Controller reconciles each namespace's ModelRoutes into its route file.
type Controller struct {
	cfg   Config
	log   *slog.Logger
	kube  kubernetes.Interface
	dyn   dynamic.Interface
	queue workqueue.TypedRateLimitingInterface[string] // namespaces

	routes cache.GenericLister
	cms    corelisters.ConfigMapLister
}

// New builds a controller; Run starts it.
func New(restCfg *rest.Config, cfg Config) (*Controller, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	kube, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	return &Controller{cfg: cfg, log: cfg.Logger.With("controller", "modelroutes"), kube: kube, dyn: dyn,
		queue: workqueue.NewTypedRateLimitingQueueWithConfig(workqueue.DefaultTypedControllerRateLimiter[string](),
			workqueue.TypedRateLimitingQueueConfig[string]{Name: "modelroutes"})}, nil
}

// Run waits until the API server serves ModelRoutes, then reconciles until
// ctx ends. It returns after its worker and informers have stopped.
func (c *Controller) Run(ctx context.Context) error {
	defer c.queue.ShutDown()
	if !c.waitForCRD(ctx) {
		return nil
	}
	dynInf := dynamicinformer.NewFilteredDynamicSharedInformerFactory(c.dyn, c.cfg.Resync, c.cfg.Namespace, nil)
	kubeInf := informers.NewSharedInformerFactoryWithOptions(c.kube, c.cfg.Resync, informers.WithNamespace(c.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", c.cfg.ConfigMap).String()
		}))
	rInf := dynInf.ForResource(v1alpha1.ModelRoutesResource)
	cmInf := kubeInf.Core().V1().ConfigMaps()
	c.routes, c.cms = rInf.Lister(), cmInf.Lister()
	for _, inf := range []cache.SharedIndexInformer{rInf.Informer(), cmInf.Informer()} {
		if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
			AddFunc:    c.enqueue,
			UpdateFunc: func(_, o any) { c.enqueue(o) },
			DeleteFunc: c.enqueue,
		}); err != nil {
			return err
		}
	}
	dynInf.Start(ctx.Done())
	kubeInf.Start(ctx.Done())
	defer dynInf.Shutdown()
	defer kubeInf.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), rInf.Informer().HasSynced, cmInf.Informer().HasSynced) {
		return nil // stopped before the caches synced
	}
	c.log.Info("model routes running", "namespace", c.cfg.Namespace, "configMap", c.cfg.ConfigMap, "key", c.cfg.Key)
	var wg sync.WaitGroup
	wg.Go(func() {
		for c.processNext(ctx) {
		}
	})
	<-ctx.Done()
	c.queue.ShutDown()
	wg.Wait()
	return nil
}

// waitForCRD reports once the API server serves modelroutes; false when ctx
// ended first.
func (c *Controller) waitForCRD(ctx context.Context) bool {
	logged := false
	for {
		if c.served() {
			return true
		}
		if !logged {
			c.log.Info("ModelRoute CRD not installed; model routes wait for it", "recheck", c.cfg.CRDRecheck)
			logged = true
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(c.cfg.CRDRecheck):
		}
	}
}

func (c *Controller) served() bool {
	rl, err := c.kube.Discovery().ServerResourcesForGroupVersion(v1alpha1.SchemeGroupVersion.String())
	if err != nil {
		return false
	}
	for _, r := range rl.APIResources {
		if r.Name == v1alpha1.ModelRoutesResource.Resource {
			return true
		}
	}
	return false
}

// enqueue queues the namespace of a ModelRoute or ConfigMap event.
func (c *Controller) enqueue(obj any) {
	if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
		obj = d.Obj
	}
	if m, ok := obj.(metav1.Object); ok {
		c.queue.Add(m.GetNamespace())
	}
}

func (c *Controller) processNext(ctx context.Context) bool {
	ns, quit := c.queue.Get()
	if quit {
		return false
	}
	defer c.queue.Done(ns)
	if err := c.reconcile(ctx, ns); err != nil {
		c.log.Warn("reconcile", "namespace", ns, "err", err)
		c.queue.AddRateLimited(ns)
		return true
	}
	c.queue.Forget(ns)
	return true
}

// reconcile writes namespace ns's route file and its routes' status.
func (c *Controller) reconcile(ctx context.Context, ns string) error {
	objs, err := c.routes.ByNamespace(ns).List(labels.Everything())
	if err != nil {
		return err
	}
	plan := planRoutes(objs)
	cm, err := c.cms.ConfigMaps(ns).Get(c.cfg.ConfigMap)
	switch {
	case apierrors.IsNotFound(err):
		cm = nil
	case err != nil:
		return err
	}
	programmed, why := c.writeFile(ctx, ns, cm, plan)
	observe(ns, plan, programmed)
	var errs []error
	if why.err != nil {
		errs = append(errs, why.err)
	}
	for i := range plan.entries {
		if err := c.writeStatus(ctx, &plan.entries[i], programmed, why); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// notProgrammed says why the file does not hold the accepted routes.
type notProgrammed struct {
	reason, message string
	err             error // to retry
}

// writeFile creates or updates ns's ConfigMap with plan's file. It reports
// whether the file now holds the accepted routes, and why not.
func (c *Controller) writeFile(ctx context.Context, ns string, cm *corev1.ConfigMap, plan plan) (bool, notProgrammed) {
	data, err := plan.render("namespace " + ns)
	if err != nil { // unreachable: each route passed the same validation
		return false, notProgrammed{reason: "RenderFailed", message: err.Error()}
	}
	switch {
	case cm == nil && len(plan.entries) == 0:
		return true, notProgrammed{} // nothing to route, nothing written
	case cm == nil:
		cm = &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: c.cfg.ConfigMap, Namespace: ns,
			Labels: map[string]string{LabelManagedBy: ManagedBy}}, Data: map[string]string{c.cfg.Key: data}}
		if _, err := c.kube.CoreV1().ConfigMaps(ns).Create(ctx, cm, metav1.CreateOptions{}); err != nil {
			fileWrites.WithLabelValues("error").Inc()
			return false, notProgrammed{reason: "WriteFailed", message: err.Error(), err: err}
		}
		fileWrites.WithLabelValues("created").Inc()
		c.log.Info("route file created", "namespace", ns, "configMap", c.cfg.ConfigMap, "routes", plan.accepted())
		return true, notProgrammed{}
	case cm.Labels[LabelManagedBy] != ManagedBy:
		return false, notProgrammed{reason: "ConfigMapNotManaged", message: fmt.Sprintf(
			"ConfigMap %s exists without label %s=%s; the orchestrator does not overwrite it", c.cfg.ConfigMap, LabelManagedBy, ManagedBy)}
	case cm.Data[c.cfg.Key] == data:
		return true, notProgrammed{}
	}
	cm = cm.DeepCopy()
	if cm.Data == nil {
		cm.Data = map[string]string{}
	}
	cm.Data[c.cfg.Key] = data
	if _, err := c.kube.CoreV1().ConfigMaps(ns).Update(ctx, cm, metav1.UpdateOptions{}); err != nil {
		fileWrites.WithLabelValues("error").Inc()
		return false, notProgrammed{reason: "WriteFailed", message: err.Error(), err: err}
	}
	fileWrites.WithLabelValues("updated").Inc()
	c.log.Info("route file updated", "namespace", ns, "configMap", c.cfg.ConfigMap, "routes", plan.accepted())
	return true, notProgrammed{}
}
