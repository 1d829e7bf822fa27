package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
)

// The write fence. client-go's LeaderElector stops a leader only when its
// renew loop gives up, RenewDeadline after the last renewal it saw
// succeed, and it measures that from where the loop is, not from the
// clock: a process frozen (GC pause, cgroup freeze, live migration) past
// the lease's expiry wakes with its workers and informers running, and
// they write from stale caches beside the new leader until the loop
// notices, up to RenewDeadline later. client-go offers nothing to close
// that gap: IsLeader compares the holder of the record last observed,
// which stays this replica until a renewal fails; Check (the healthz
// adaptor's) only reports a lease expired by more than LeaseDuration plus
// a tolerance, after another replica may have taken it, and its clock is
// not injectable. So the controller keeps its own record: the monotonic
// time at which the last successful acquire or renew was sent, and no
// write leaves the process once now is past that plus validFor.

// errFenced is what a write gets once the fence has closed, or before the
// lease was ever acquired.
var errFenced = errors.New("orchestrator: not holding a valid lease: write refused")

// fenceClock is the fence's monotonic clock: time.Now's in production,
// a fake a test steps.
type fenceClock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// fence is one term's proof of leadership. It closes for good at the
// first check or timer that finds the last renewal older than validFor
// (a new term gets a new fence), calling onExpire once.
type fence struct {
	clock    fenceClock
	validFor time.Duration
	onExpire func(error)
	renewedC chan struct{} // poked (never blocking) by each renewal: the watcher re-arms

	mu      sync.Mutex // guards the fields below
	renewed time.Time  // when the last successful acquire or renew was sent; zero: none yet
	closed  error      // set once: why the fence closed
	lockErr error      // the lock's last failure, for the log line saying why the lease went
}

// fenceValidity is how long a renewal is trusted: LeaseDuration less a
// margin of LeaseDuration − RenewDeadline (5 s by default, client-go's own
// allowance for clock-rate skew between replicas), which is RenewDeadline.
// The margin also covers a write that passed the check just before the
// fence closed and is still on its way to the API server. Renewals succeed
// every RetryPeriod while the API server answers, so a healthy leader never
// comes near it.
func fenceValidity(leaseDuration, renewDeadline time.Duration) time.Duration {
	margin := leaseDuration - renewDeadline
	return leaseDuration - margin
}

func newFence(clk fenceClock, validFor time.Duration, onExpire func(error)) *fence {
	return &fence{clock: clk, validFor: validFor, onExpire: onExpire, renewedC: make(chan struct{}, 1)}
}

// renew records a successful acquire or renew whose request was sent at
// sent. The send time, not the reply's: the other replicas measure the
// lease from when they see the record change, which is no earlier.
func (f *fence) renew(sent time.Time) {
	f.mu.Lock()
	if f.closed == nil && sent.After(f.renewed) {
		f.renewed, f.lockErr = sent, nil
	}
	f.mu.Unlock()
	select {
	case f.renewedC <- struct{}{}:
	default:
	}
}

func (f *fence) lockFailed(err error) {
	f.mu.Lock()
	f.lockErr = err
	f.mu.Unlock()
}

// check returns nil while the lease is known valid; the first call to find
// it stale closes the fence.
func (f *fence) check() error {
	f.mu.Lock()
	if f.closed != nil {
		err := f.closed
		f.mu.Unlock()
		return err
	}
	if f.renewed.IsZero() {
		f.mu.Unlock()
		return errFenced // not acquired yet: nothing to close
	}
	age := f.clock.Now().Sub(f.renewed)
	if age <= f.validFor {
		f.mu.Unlock()
		return nil
	}
	why := fmt.Sprintf("last lease renewal %v ago, more than the %v a renewal is trusted for", age.Round(time.Millisecond), f.validFor)
	if f.lockErr != nil {
		why += "; last lease error: " + f.lockErr.Error()
	}
	f.closed = fmt.Errorf("%w (%s)", errFenced, why)
	err := f.closed
	f.mu.Unlock()
	f.onExpire(err)
	return err
}

// watch closes the fence as soon as the last renewal goes stale, so the
// controller is stopped even when no write or work item comes to check.
// It returns when ctx ends or the fence closed.
func (f *fence) watch(ctx context.Context) {
	for {
		f.mu.Lock()
		renewed := f.renewed
		f.mu.Unlock()
		var expiry <-chan time.Time
		if !renewed.IsZero() {
			expiry = f.clock.After(renewed.Add(f.validFor).Sub(f.clock.Now()) + time.Millisecond)
		}
		select {
		case <-ctx.Done():
			return
		case <-f.renewedC:
		case <-expiry:
			if f.check() != nil {
				return
			}
		}
	}
}

// fencedLock is the Lease lock with each successful acquire and renew
// recorded in the fence. It wraps the lock rather than reading the
// LeaderElector's state because only the lock sees when a request was sent.
// It also guards the release (see release).
type fencedLock struct {
	resourcelock.Interface
	fence *fence
	log   *slog.Logger
}

func (l *fencedLock) Create(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	return l.record(r, func() error { return l.Interface.Create(ctx, r) })
}

func (l *fencedLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if r.HolderIdentity == "" {
		return l.release(ctx, r)
	}
	return l.record(r, func() error { return l.Interface.Update(ctx, r) })
}

// release writes client-go's release (ReleaseOnCancel: the record with an
// empty holder, once the term's renew loop ended) only over a Lease this
// replica still holds in a term whose fence is open. client-go's
// tryRelease Gets the Lease, which hands the lock the current
// resourceVersion, but decides with the record its elector last observed:
// a replica frozen past its lease (SIGSTOP, a live migration) resumes, its
// fence closes and ends the term before the renew loop has read the Lease
// again, so that stale record still names it, and the release would empty
// the record of the replica that took the Lease meanwhile (which then
// leads beside it until its own renewal fails). So:
//
//   - never once the fence has closed: a write that passed the fence just
//     before it closed may still be on its way, and the other replicas'
//     wait for the lease to expire is the margin that covers it
//     (fenceValidity); releasing would hand them the Lease at once;
//   - otherwise only when a Get made here, just before the write, names this
//     replica the holder. The lock's Update sends the resourceVersion of
//     that Get, so a write by another replica in between fails with a
//     conflict (client-go's tryRelease then tries again from its Get).
//
// A refused release writes nothing and returns nil: there is nothing of
// this replica's to release, which is how client-go treats a Lease it sees
// held by another (tryRelease's !IsLeader), and the elector is discarded
// with the term anyway. The Lease then expires as if this replica had
// stopped.
func (l *fencedLock) release(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	if err := l.fence.check(); err != nil {
		l.log.Info("not releasing the lease: this term's fence is closed, so the lease is left to expire", "identity", l.Identity(), "err", err)
		return nil
	}
	cur, _, err := l.Interface.Get(ctx)
	if err != nil {
		l.fence.lockFailed(err)
		return err
	}
	if cur.HolderIdentity != l.Identity() {
		l.log.Info("not releasing the lease: another replica holds it", "identity", l.Identity(), "holder", cur.HolderIdentity)
		return nil
	}
	return l.Interface.Update(ctx, r)
}

func (l *fencedLock) Get(ctx context.Context) (*resourcelock.LeaderElectionRecord, []byte, error) {
	r, raw, err := l.Interface.Get(ctx)
	if err != nil && !apierrors.IsNotFound(err) { // NotFound: the first acquire creates it
		l.fence.lockFailed(err)
	}
	return r, raw, err
}

// record counts a write as a renewal only when it makes this replica the
// holder (the release, which empties it, goes through release).
func (l *fencedLock) record(r resourcelock.LeaderElectionRecord, write func() error) error {
	sent := l.fence.clock.Now()
	err := write()
	switch {
	case err != nil:
		l.fence.lockFailed(err)
	case r.HolderIdentity == l.Identity():
		l.fence.renew(sent)
	}
	return err
}

// fencedTransport refuses every mutating request of the controller's
// clients unless the current term's fence is open. It is the one place
// every write passes (pods, services, RoleScalers, status, events, the
// ModelRoute ConfigMaps), so no code path can forget the check; reads and
// watches pass, so informers keep their caches. The Lease is written
// through a client of its own, never through this transport: the fence
// must not block the renewal that keeps it open.
type fencedTransport struct {
	rt    http.RoundTripper
	fence func() *fence // the current term's; nil between terms
}

func (t *fencedTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	switch req.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
	default:
		f := t.fence()
		if f == nil {
			return nil, errFenced
		}
		if err := f.check(); err != nil {
			return nil, err
		}
	}
	return t.rt.RoundTrip(req)
}

// lastLockErr is the lock's last failure (nil: none).
func (f *fence) lastLockErr() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lockErr
}
