package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"os"
	"sync"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// runElected runs the controller while this replica holds the Lease. Losing
// the lease stops the controller (and Run returns); a restart (by the pod's
// restart policy) rejoins the election with empty caches, as client-go's
// leader election expects.
func (c *Controller) runElected(ctx context.Context) error {
	id := c.cfg.Identity
	if id == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		id = host + "-" + hex.EncodeToString(b)
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, c.cfg.LeaseNamespace, c.cfg.LeaseName,
		c.kube.CoreV1(), c.kube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// client-go starts OnStartedLeading in a goroutine of its own and does
	// not wait for it when Run returns, and may start it after that: this
	// function owns the controller's run, so a callback that starts late
	// does nothing, and Run's return waits for one that started.
	var (
		mu      sync.Mutex
		stopped bool
		running sync.WaitGroup
		runErr  error
	)
	le, err := leaderelection.NewLeaderElector(leaderelection.LeaderElectionConfig{
		Lock: lock, ReleaseOnCancel: true, Name: c.cfg.LeaseName,
		LeaseDuration: c.cfg.LeaseDuration, RenewDeadline: c.cfg.RenewDeadline, RetryPeriod: c.cfg.RetryPeriod,
		Callbacks: leaderelection.LeaderCallbacks{
			OnStartedLeading: func(ctx context.Context) {
				mu.Lock()
				if stopped {
					mu.Unlock()
					return
				}
				running.Add(1)
				mu.Unlock()
				defer running.Done()
				c.log.Info("leading", "lease", c.cfg.LeaseNamespace+"/"+c.cfg.LeaseName, "identity", id)
				err := c.run(ctx)
				mu.Lock()
				runErr = err
				mu.Unlock()
				cancel()
			},
			OnStoppedLeading: func() {
				c.log.Info("stopped leading", "identity", id)
				cancel()
			},
		},
	})
	if err != nil {
		return err
	}
	le.Run(ctx)
	mu.Lock()
	stopped = true
	mu.Unlock()
	running.Wait() // ctx is cancelled once Run returns: the controller stops
	mu.Lock()
	defer mu.Unlock()
	return runErr
}
