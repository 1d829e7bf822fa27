package orchestrator

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/webhook"
)

// The controller is the webhook's Leader (cmd/kvmesh wires it).
var _ webhook.Leader = (*Controller)(nil)

// leaseHolder is the term Lease's holder ("" when released or missing) and
// its resourceVersion.
func (e *env) leaseHolder(t testing.TB, c *Controller) (holder, rv string) {
	t.Helper()
	l, err := e.kube.CoordinationV1().Leases(c.cfg.LeaseNamespace).Get(e.ctx, c.cfg.LeaseName, metav1.GetOptions{})
	if err != nil {
		return "", ""
	}
	if l.Spec.HolderIdentity != nil {
		holder = *l.Spec.HolderIdentity
	}
	return holder, l.ResourceVersion
}

// leaseWrites records every write of the term Lease after a resourceVersion.
type leaseWrites struct {
	mu      sync.Mutex
	holders []string
	rvs     map[string]bool
}

// watchLease records the Lease's writes after rv until the test ends.
func (e *env) watchLease(t *testing.T, c *Controller, rv string) *leaseWrites {
	t.Helper()
	w, err := e.kube.CoordinationV1().Leases(c.cfg.LeaseNamespace).Watch(e.ctx, metav1.ListOptions{
		FieldSelector: "metadata.name=" + c.cfg.LeaseName, ResourceVersion: rv})
	if err != nil {
		t.Fatal(err)
	}
	lw := &leaseWrites{rvs: map[string]bool{rv: true}}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ev := range w.ResultChan() {
			l, ok := ev.Object.(*coordinationv1.Lease)
			if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified && ev.Type != watch.Deleted) {
				continue
			}
			holder := "<deleted>"
			if ev.Type != watch.Deleted {
				holder = ""
				if l.Spec.HolderIdentity != nil {
					holder = *l.Spec.HolderIdentity
				}
			}
			lw.mu.Lock()
			lw.holders, lw.rvs[l.ResourceVersion] = append(lw.holders, holder), true
			lw.mu.Unlock()
		}
	}()
	t.Cleanup(func() { w.Stop(); <-done })
	return lw
}

// upToNow is the holders of the Lease's writes from the watch's start up to
// its state now (read here: the watch has delivered that write).
func (lw *leaseWrites) upToNow(t *testing.T, e *env, c *Controller) []string {
	t.Helper()
	_, now := e.leaseHolder(t, c)
	testutil.WaitFor(t, wait, "the watch to deliver the Lease's current state", func() bool {
		lw.mu.Lock()
		defer lw.mu.Unlock()
		return lw.rvs[now]
	})
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return append([]string(nil), lw.holders...)
}

// TestReleaseOnlyOwnLiveLease: client-go's ReleaseOnCancel empties the
// Lease's holder when a term ends, deciding from the record its elector
// last observed. A leader frozen past its lease (here: its renewal held by
// the lock, its fence clock not moving, as in a SIGSTOPped process) whose
// term then ends would empty the record of the replica that took the
// Lease meanwhile, re-acquire it, and lead beside that replica until its
// renewal fails. The release must leave the new holder's Lease alone
// whether the frozen leader's term ends by its fence closing on resume or
// by a shutdown; a term whose fence closed must not release even a Lease
// it still holds (a write that passed the fence just before may be in
// flight; the others' wait for expiry covers it); and a clean shutdown
// still releases. The Lease's writes are read from a watch of the real API
// server.
func TestReleaseOnlyOwnLiveLease(t *testing.T) {
	cases := []struct {
		name     string
		takeover bool // another replica takes the Lease while a is frozen
		fence    bool // a's term ends by its fence closing (else: a shuts down)
	}{
		{name: "taken over, fence closes on resume", takeover: true, fence: true},
		{name: "taken over, shut down on resume", takeover: true},
		{name: "still held, fence closes on resume", fence: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t)
			logA := &testutil.SyncBuffer{}
			a := e.newTestController(t, userAgent(e.srv.Config, "orch-a"), "a", logA)
			clk, lock := newFakeClock(), newStallingLock()
			a.clock, a.wrapLock = clk, lock.wrap
			ctxA, stopA := context.WithCancel(context.Background())
			defer stopA()
			runA := testutil.Run(t, "controller a", func(ctx context.Context) error {
				defer context.AfterFunc(ctx, stopA)()
				return a.Run(ctxA)
			}, logA.String)
			t.Cleanup(lock.resume) // before a's Run is waited for
			testutil.WaitFor(t, wait, "a to lead", func() bool {
				h, _ := e.leaseHolder(t, a)
				return h == "a" && strings.Contains(logA.String(), "msg=leading")
			})
			losses := promtest.ToFloat64(leaseLosses.WithLabelValues(lossFence))

			lock.stall() // a freezes
			select {
			case <-lock.stuck:
			case <-time.After(wait):
				t.Fatal("a did not try to renew")
			}
			want := "a"
			logB := &testutil.SyncBuffer{}
			if tc.takeover {
				want = "b"
				b := e.newTestController(t, userAgent(e.srv.Config, "orch-b"), "b", logB)
				testutil.Run(t, "controller b", b.Run, logB.String)
				testutil.WaitFor(t, wait, "b to take the Lease a stopped renewing", func() bool {
					h, _ := e.leaseHolder(t, b)
					return h == "b"
				})
			}
			_, rv := e.leaseHolder(t, a)
			writes := e.watchLease(t, a, rv)

			// a resumes: its fence finds the last renewal too old (the fake
			// clock steps past the fence time, as the monotonic clock of a
			// process stopped that long), or its shutdown arrives.
			if tc.fence {
				clk.Step(a.cfg.RenewDeadline + time.Millisecond)
			} else {
				stopA()
			}
			lock.resume()
			if tc.fence {
				testutil.WaitFor(t, wait, "a's term to end (after its release)", func() bool {
					return strings.Contains(logA.String(), "lost the lease")
				})
			} else {
				select {
				case <-runA.Done():
				case <-time.After(wait):
					t.Fatal("a did not stop")
				}
			}

			holders := writes.upToNow(t, e, a)
			for _, h := range holders {
				if h != want {
					t.Fatalf("the Lease %s held was written with holder %q after a resumed; holders written: %q\na:\n%s\nb:\n%s",
						want, h, holders, logA.String(), logB.String())
				}
			}
			if !strings.Contains(logA.String(), "not releasing the lease") {
				t.Errorf("a did not log why it left the Lease alone:\n%s", logA.String())
			}
			if tc.takeover {
				if n := strings.Count(logA.String(), "msg=leading"); n != 1 {
					t.Errorf("a led %d times, want once (before it froze):\n%s", n, logA.String())
				}
				if strings.Contains(logB.String(), "lost the lease") || strings.Contains(logB.String(), "stopped leading") {
					t.Errorf("b lost the Lease:\n%s", logB.String())
				}
				testutil.WaitFor(t, wait, "one leader counted (b)", func() bool { return promtest.ToFloat64(leaderGauge) == 1 })
			}
			if got := promtest.ToFloat64(leaseLosses.WithLabelValues(lossFence)) - losses; tc.fence && got != 1 {
				t.Errorf("kvmesh_orchestrator_lease_losses_total{how=fence} rose by %v, want 1", got)
			}
		})
	}

	// A clean shutdown still hands the Lease over at once.
	t.Run("clean shutdown releases", func(t *testing.T) {
		e := newEnv(t)
		a := e.newTestController(t, e.srv.Config, "a", nil)
		ctxA, stopA := context.WithCancel(context.Background())
		defer stopA()
		runA := testutil.Run(t, "controller a", func(ctx context.Context) error {
			defer context.AfterFunc(ctx, stopA)()
			return a.Run(ctxA)
		}, nil)
		testutil.WaitFor(t, wait, "a to lead", func() bool {
			h, _ := e.leaseHolder(t, a)
			leading, _ := a.Leading()
			return h == "a" && promtest.ToFloat64(leaderGauge) == 1 && leading
		})
		_, changed := a.Leading()
		stopA()
		select {
		case <-runA.Done():
		case <-time.After(wait):
			t.Fatal("a did not stop")
		}
		if h, rv := e.leaseHolder(t, a); h != "" || rv == "" {
			t.Errorf("after a clean shutdown the Lease is held by %q (resourceVersion %q), want released", h, rv)
		}
		if g := promtest.ToFloat64(leaderGauge); g != 0 {
			t.Errorf("kvmesh_orchestrator_leader %v after the shutdown, want 0", g)
		}
		select {
		case <-changed:
		default:
			t.Error("Leading's channel was not closed when a stopped leading")
		}
		if leading, _ := a.Leading(); leading {
			t.Error("a reports leading after its shutdown")
		}
	})
}

// TestLeadingWithoutElection: without leader election the one replica
// leads (the webhook registers its URL).
func TestLeadingWithoutElection(t *testing.T) {
	cfg := DefaultConfig()
	cfg.LeaderElection = false
	c, err := New(&rest.Config{Host: "https://127.0.0.1:1"}, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if leading, _ := c.Leading(); !leading {
		t.Error("a controller without leader election does not lead")
	}
}
