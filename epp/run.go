package epp

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/logutil"
)

// Options is what `kvmesh epp` runs: an ingress replica (its Options: mesh,
// scheduler, tokenizers, limits) serving its decisions to the gateway over
// ext_proc, and the InferencePool to follow. The command's flags bind onto
// it (cmd/kvmesh/epp.go).
type Options struct {
	Ingress ingress.Options
	Picker  Config
	// PoolName and PoolNamespace name the InferencePool whose ready pods are
	// the candidates; "" name: every engine the mesh knows.
	PoolName, PoolNamespace string
	// Kubeconfig is the kubeconfig file for the pool informer; "": in-cluster.
	Kubeconfig string
}

// DefaultOptions: the ingress's defaults with its HTTP listener on :9090
// (/metrics, /health and /ready only; Run narrows it) and the picker on
// :9002.
func DefaultOptions() Options {
	o := Options{Ingress: ingress.DefaultOptions(), Picker: DefaultConfig()}
	o.Ingress.Config.Listen = ":9090"
	// The data plane carries the engines' bytes, so the picker sees no
	// progress after the first one: the ingress's stall watch would probe
	// every engine with a long stream. Off here.
	o.Ingress.Config.Health.StallAfter = 0
	return o
}

// Validate lists every problem.
func (o *Options) Validate() error {
	errs := []error{o.Ingress.Validate(), o.Picker.Validate()}
	if o.PoolName != "" && o.PoolNamespace == "" {
		errs = append(errs, fmt.Errorf("%w: a pool name needs its namespace", ErrConfig))
	}
	return errors.Join(errs...)
}

// Run serves the picker until ctx ends, then drains: the pool informer (when
// a pool is named), the ingress replica (mesh, index; /metrics, /health and
// /ready on its HTTP listener, no client API) and the ext_proc server.
func Run(ctx context.Context, o Options, stdout, stderr io.Writer) error {
	if err := o.Validate(); err != nil {
		return err
	}
	// Clients reach the engines through the gateway; the client API on the
	// HTTP listener would be a way around it and its authentication.
	o.Ingress.Config.OpsOnly = true
	log := logutil.New(stderr, o.Ingress.LogFormat, o.Ingress.LogLevel)
	ing, err := o.Ingress.NewServer(ctx, log)
	if err != nil {
		return err
	}
	cfg := o.Picker
	cfg.Logger, cfg.Registerer = log, ing.Registry()
	deps := Deps{Ingress: ing}
	poolCtx, stopPool := context.WithCancel(context.Background())
	defer stopPool()
	poolDone := make(chan error, 1)
	if o.PoolName != "" {
		rc, err := kubeConfig(o.Kubeconfig)
		if err != nil {
			return fmt.Errorf("pool: %w", err)
		}
		pool, err := NewPool(rc, o.PoolNamespace, o.PoolName, log)
		if err != nil {
			return err
		}
		deps.Pool = pool
		go func() { poolDone <- pool.Run(poolCtx) }()
	} else {
		poolDone <- nil
	}
	picker, err := New(cfg, deps)
	if err != nil {
		return err
	}
	// Background: the drain below closes the ingress in order, not ctx.
	if err := ing.Start(context.Background()); err != nil {
		return err
	}
	if err := picker.Start(); err != nil {
		ing.Close()
		return err
	}
	banner := ingress.Banner(stdout, o.Ingress.LogFormat) // one JSON object per line in JSON mode
	banner(fmt.Sprintf("kvmesh epp: ext_proc on %s, metrics on http://%s", picker.Addr(), ing.Addr()),
		"ext_proc", picker.Addr(), "metrics", "http://"+ing.Addr())
	<-ctx.Done()
	banner("draining")
	sctx, cancel := context.WithTimeout(context.Background(), cfg.DrainDelay+o.Ingress.Config.DrainTimeout+5*time.Second)
	defer cancel()
	picker.Close(sctx)
	err = ing.Close()
	stopPool()
	if perr := <-poolDone; perr != nil && err == nil {
		err = perr
	}
	return err
}

func kubeConfig(path string) (*rest.Config, error) {
	if path != "" {
		return clientcmd.BuildConfigFromFlags("", path)
	}
	return rest.InClusterConfig()
}
