package orchestrator

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// Leader election's metrics. LeaderCollectors lists them for the
// registry the orchestrator's metrics are served from.
var (
	leaderGauge = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_orchestrator_leader",
		Help: "1 while this replica holds the Lease and runs the controller (a term), else 0 (always 0 without leader election). Summed over the replicas it is 1, more only for the overlap of a hand-over.",
	})
	leaseLosses = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_lease_losses_total",
		Help: "Terms that ended with the lease lost (the replica rejoins the election), by how: fence (the write fence closed first: no renewal for RenewDeadline) or renew (client-go's renew loop gave up).",
	}, []string{"how"})
)

func init() {
	for _, how := range []string{lossFence, lossRenew} {
		leaseLosses.WithLabelValues(how)
	}
}

// How a term lost its lease (kvmesh_orchestrator_lease_losses_total's how).
const (
	lossFence = "fence"
	lossRenew = "renew"
)

// LeaderCollectors are leader election's metrics: kvmesh_orchestrator_leader
// and kvmesh_orchestrator_lease_losses_total.
func LeaderCollectors() []prometheus.Collector {
	return []prometheus.Collector{leaderGauge, leaseLosses}
}

// leaderSignal is a Controller's leadership as the parts of the process
// that act on the leader alone read it (Leading).
type leaderSignal struct {
	mu      sync.Mutex
	leading bool
	changed chan struct{} // closed at the next change
}

// leaderSignals holds each Controller's leaderSignal, created on first use
// (a field of Controller would belong to controller.go). One small entry
// per Controller ever made: a process makes one.
var leaderSignals sync.Map // *Controller → *leaderSignal

func (c *Controller) leader() *leaderSignal {
	v, _ := leaderSignals.LoadOrStore(c, &leaderSignal{changed: make(chan struct{})})
	return v.(*leaderSignal)
}

func (s *leaderSignal) set(leading bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leading != leading {
		s.leading = leading
		close(s.changed)
		s.changed = make(chan struct{})
	}
}

// Leading reports whether this replica leads (a term's controller is
// running; always, without leader election) and returns a channel closed
// at the next change. It is a webhook.Leader: out of cluster only the
// leader registers the webhook's URL.
func (c *Controller) Leading() (bool, <-chan struct{}) {
	s := c.leader()
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leading || !c.cfg.LeaderElection, s.changed
}

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
		led, how, why, err := c.runTerm(ctx, id)
		if err != nil || ctx.Err() != nil {
			return err
		}
		if led {
			if how != "" {
				leaseLosses.WithLabelValues(how).Inc()
			}
			c.log.Warn("lost the lease: rejoining the election with fresh caches", "identity", id, "reason", why)
		}
	}
}

// runTerm runs one election and, once elected, the controller until the
// lease is lost or ctx ends. led reports that it led; how (lossFence,
// lossRenew) and why say how the lease was lost; err is the controller's
// own failure.
func (c *Controller) runTerm(ctx context.Context, id string) (led bool, how, why string, err error) {
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
		lost    string // how the lease was lost, if that ended the term
	)
	because := func(how, s string) {
		mu.Lock()
		if reason == "" {
			reason, lost = s, how
		}
		mu.Unlock()
	}
	f := newFence(c.clock, fenceValidity(c.cfg.LeaseDuration, c.cfg.RenewDeadline), func(err error) {
		c.log.Warn("lease fence closed: stopping the controller before another replica may lead", "identity", id, "err", err)
		because(lossFence, err.Error())
		cancel()
	})
	c.fence.Store(f)
	defer c.fence.Store(nil) // between terms every write is refused
	inner, err := resourcelock.New(resourcelock.LeasesResourceLock, c.cfg.LeaseNamespace, c.cfg.LeaseName,
		c.leaseKube.CoreV1(), c.leaseKube.CoordinationV1(), resourcelock.ResourceLockConfig{Identity: id})
	if err != nil {
		return false, "", "", err
	}
	var lock resourcelock.Interface = &fencedLock{Interface: inner, fence: f, log: c.log}
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
				leaderGauge.Inc()
				c.leader().set(true)
				err := c.run(ctx)
				c.leader().set(false)
				leaderGauge.Dec()
				mu.Lock()
				runErr = err
				mu.Unlock()
				if err != nil {
					because("", err.Error())
				}
				cancel()
			},
			OnStoppedLeading: func() {
				if ctx.Err() == nil {
					why := fmt.Sprintf("the lease was not renewed within the renew deadline (%v)", c.cfg.RenewDeadline)
					if err := f.lastLockErr(); err != nil {
						why += ": " + err.Error()
					}
					because(lossRenew, why)
				}
				c.log.Info("stopped leading", "identity", id)
				cancel()
			},
		},
	})
	if err != nil {
		return false, "", "", err
	}
	le.Run(ctx)
	mu.Lock()
	stopped = true
	mu.Unlock()
	running.Wait() // ctx is cancelled once Run returns: the controller stops
	mu.Lock()
	defer mu.Unlock()
	return leading, lost, reason, runErr
}
