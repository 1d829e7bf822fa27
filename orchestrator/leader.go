package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"

	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// runElected runs the controller during each term this replica holds the
// Lease. A term ends when the lease is lost: client-go's renew loop gave
// up, or the write fence (fence.go) closed first. The replica then stays
// up, so the webhook in the same process keeps serving and a flapping API
// server does not send every replica into CrashLoopBackOff, and rejoins
// the election with new informers, caches and work queue (newTerm): the
// old term's caches may be stale by then, and client-go's leader election
// expects a new leader to start from nothing.
func (c *Controller) runElected(ctx context.Context) error {
	id := c.cfg.Identity
	if id == "" {
		host, _ := os.Hostname()
		b := make([]byte, 4)
		_, _ = rand.Read(b)
		id = host + "-" + hex.EncodeToString(b)
	}
	for term := 0; ; term++ {
		if term > 0 {
			if err := c.newTerm(); err != nil {
				return err
			}
		}
		led, why, err := c.runTerm(ctx, id)
		if err != nil || ctx.Err() != nil {
			return err
		}
		if led {
			c.log.Warn("lost the lease: rejoining the election with fresh caches", "identity", id, "reason", why)
		}
	}
}

// runTerm runs one election and, once elected, the controller until the
// lease is lost or ctx ends. led reports that it led; why says how the
// lease was lost; err is the controller's own failure.
func (c *Controller) runTerm(ctx context.Context, id string) (led bool, why string, err error) {
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
		leading bool
		reason  string // the first cause of the term's end
	)
	because := func(s string) {
		mu.Lock()
		if reason == "" {
			reason = s
		}
		mu.Unlock()
	}
	f := newFence(c.clock, fenceValidity(c.cfg.LeaseDuration, c.cfg.RenewDeadline), func(err error) {
		c.log.Warn("lease fence closed: stopping the controller before another replica may lead", "identity", id, "err", err)
		because(err.Error())
		cancel()
	})
	c.fence.Store(f)
	defer c.fence.Store(nil) // between terms every write is refused
	inner, err := resourcelock.New(resourcelock.LeasesResourceLock, c.cfg.LeaseNamespace, c.cfg.LeaseName,
		c.leaseKube.CoreV1(), c.leaseKube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return false, "", err
	}
	var lock resourcelock.Interface = &fencedLock{Interface: inner, fence: f}
	if c.wrapLock != nil {
		lock = c.wrapLock(lock)
	}
	var watcher sync.WaitGroup
	defer watcher.Wait()
	watcher.Go(func() { f.watch(ctx) })
	defer cancel() // runs before watcher.Wait
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
				leading = true
				mu.Unlock()
				defer running.Done()
				c.log.Info("leading", "lease", c.cfg.LeaseNamespace+"/"+c.cfg.LeaseName, "identity", id)
				err := c.run(ctx)
				mu.Lock()
				runErr = err
				mu.Unlock()
				if err != nil {
					because(err.Error())
				}
				cancel()
			},
			OnStoppedLeading: func() {
				if ctx.Err() == nil {
					why := fmt.Sprintf("the lease was not renewed within the renew deadline (%v)", c.cfg.RenewDeadline)
					if err := f.lastLockErr(); err != nil {
						why += ": " + err.Error()
					}
					because(why)
				}
				c.log.Info("stopped leading", "identity", id)
				cancel()
			},
		},
	})
	if err != nil {
		return false, "", err
	}
	le.Run(ctx)
	mu.Lock()
	stopped = true
	mu.Unlock()
	running.Wait() // ctx is cancelled once Run returns: the controller stops
	mu.Lock()
	defer mu.Unlock()
	return leading, reason, runErr
}
