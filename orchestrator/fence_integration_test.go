package orchestrator

import (
	"context"
	"log/slog"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// fakeClock is the clock a test steps.
type fakeClock = testutil.SteppedClock

func newFakeClock() *fakeClock { return testutil.NewSteppedClock(time.Unix(1_000_000, 0)) }

// stallingLock stands in for a leader whose renewals stop (a frozen
// process, a renew goroutine starved): once stalled, Update waits, ignoring
// its context as a frozen process would, until resume (at the latest when
// the test ends).
type stallingLock struct {
	resourcelock.Interface
	mu      sync.Mutex
	stalled bool
	stuck   chan struct{} // closed when an Update is held
	release chan struct{}
	once    sync.Once
	resumed sync.Once
}

func newStallingLock() *stallingLock {
	return &stallingLock{stuck: make(chan struct{}), release: make(chan struct{})}
}

func (l *stallingLock) wrap(in resourcelock.Interface) resourcelock.Interface {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Interface = in
	return l
}

func (l *stallingLock) stall() {
	l.mu.Lock()
	l.stalled = true
	l.mu.Unlock()
}

// resume lets the held Update go on, as a frozen process resumes, and
// stalls no later one.
func (l *stallingLock) resume() {
	l.resumed.Do(func() {
		l.mu.Lock()
		l.stalled = false
		l.mu.Unlock()
		close(l.release)
	})
}

func (l *stallingLock) Update(ctx context.Context, r resourcelock.LeaderElectionRecord) error {
	l.mu.Lock()
	stalled, in := l.stalled, l.Interface
	l.mu.Unlock()
	if stalled {
		l.once.Do(func() { close(l.stuck) })
		<-l.release
	}
	return in.Update(ctx, r)
}

// newTestController builds (does not start) a controller for the
// namespace, leader election on a Lease there with short timings, logging
// to log (nil: discarded, or stderr under -v).
func (e *env) newTestController(t *testing.T, cfg *rest.Config, identity string, log *testutil.SyncBuffer) *Controller {
	t.Helper()
	c := DefaultConfig()
	c.Namespace, c.LeaseNamespace, c.Identity = e.ns, e.ns, identity
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	c.Logger = slog.New(slog.DiscardHandler)
	if log != nil {
		c.Logger = slog.New(slog.NewTextHandler(log, nil))
	}
	ctrl, err := New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	return ctrl
}

// userAgent is cfg for a client the API server records as manager ua.
func userAgent(cfg *rest.Config, ua string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.UserAgent = ua
	return c
}

const fenceDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"NAME"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"decode","kind":"decode","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`

// TestStalledLeaderFenced: a leader whose renewals stop writes nothing
// once its last renewal is older than the fence's validity, although
// client-go's renew loop (stuck in the lock's Update) never tells it it
// lost the lease. Its workers and informers keep running, so without the
// fence it would reconcile a deployment created afterwards beside the new
// leader. The fence's clock is stepped, so nothing depends on timing; the
// API server's managedFields name every writer of the new deployment's
// objects, and none may be the stalled leader.
func TestStalledLeaderFenced(t *testing.T) {
	e := newEnv(t)
	logA := &testutil.SyncBuffer{}
	a := e.newTestController(t, userAgent(e.srv.Config, "orch-a"), "a", logA)
	clk, lock := newFakeClock(), newStallingLock()
	a.clock, a.wrapLock = clk, lock.wrap
	testutil.Run(t, "controller a", a.Run, logA.String)
	t.Cleanup(lock.resume) // before a's Run is waited for

	if err := e.applyDoc(t, replaceAll(fenceDoc, "NAME", "before")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "a to reconcile the first deployment", func() bool {
		return len(e.pods(t, labels.Set{v1alpha1.LabelDeployment: "before"})) == 1
	})
	lock.stall()
	select {
	case <-lock.stuck:
	case <-time.After(wait):
		t.Fatal("a did not try to renew")
	}
	// Every renewal a made was sent at the clock's start: step just past
	// the documented fence time, LeaseDuration less LeaseDuration −
	// RenewDeadline (stated here, not read from the code under test).
	clk.Step(a.cfg.RenewDeadline + time.Millisecond)

	if err := e.applyDoc(t, replaceAll(fenceDoc, "NAME", "after")); err != nil {
		t.Fatal(err)
	}
	b := e.newTestController(t, userAgent(e.srv.Config, "orch-b"), "b", nil)
	testutil.Run(t, "controller b", b.Run, nil)
	sel := labels.Set{v1alpha1.LabelDeployment: "after"}
	testutil.WaitFor(t, wait, "b to lead and reconcile the second deployment", func() bool {
		md := e.md(t, "after")
		_, svcErr := e.kube.CoreV1().Services(e.ns).Get(e.ctx, "after", metav1.GetOptions{})
		return len(e.pods(t, sel)) == 1 && svcErr == nil && md.Status.ObservedGeneration == md.Generation &&
			slices.Contains(md.Finalizers, Finalizer)
	})

	var writers []string
	note := func(kind, name string, mf []metav1.ManagedFieldsEntry) {
		for _, m := range mf {
			writers = append(writers, kind+"/"+name+":"+m.Manager)
			if m.Manager == "orch-a" {
				t.Errorf("%s %s written by the fenced leader after its fence time (%s at %v)", kind, name, m.Operation, m.Time)
			}
		}
	}
	md := e.md(t, "after")
	note("ModelDeployment", md.Name, md.ManagedFields)
	for _, p := range e.pods(t, sel) {
		note("Pod", p.Name, p.ManagedFields)
	}
	svc, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx, "after", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	note("Service", svc.Name, svc.ManagedFields)
	if !slices.ContainsFunc(writers, func(w string) bool { return strings.HasSuffix(w, ":orch-b") }) {
		t.Fatalf("b's writes are not told apart by manager: %v", writers)
	}
	if !strings.Contains(logA.String(), "lease fence closed") {
		t.Errorf("a logged no fence closing:\n%s", logA.String())
	}
}

// TestLeaseLossRejoins: an API server unreachable for longer than the
// renew deadline costs the leader its lease; the replica stays up (Run
// does not return), says at WARN why, and once the API server is back
// leads again with fresh caches and queue and reconciles what changed
// meanwhile.
func TestLeaseLossRejoins(t *testing.T) {
	e := newEnv(t)
	gate := testutil.NewGate(t)
	u, err := url.Parse(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	gate.Open(u.Host)
	cfg := rest.CopyConfig(e.srv.Config)
	cfg.Host = "https://" + gate.Addr()
	log := &testutil.SyncBuffer{}
	ctrl := e.newTestController(t, cfg, "a", log)
	run := testutil.Run(t, "controller", ctrl.Run, log.String)

	if err := e.applyDoc(t, replaceAll(fenceDoc, "NAME", "rejoin")); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "rejoin"}
	var first corev1.Pod
	testutil.WaitFor(t, wait, "the deployment's pod", func() bool {
		ps := e.pods(t, sel)
		if len(ps) == 1 {
			first = ps[0]
		}
		return len(ps) == 1
	})

	gate.Shut()
	testutil.WaitFor(t, wait, "a WARN that the lease was lost", func() bool {
		return strings.Contains(log.String(), "level=WARN msg=\"lost the lease")
	})
	// Changed while the replica is cut off: only a fresh term sees it.
	if err := e.kube.CoreV1().Pods(e.ns).Delete(e.ctx, first.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil {
		t.Fatal(err)
	}
	gate.Open(u.Host)
	testutil.WaitFor(t, wait, "the pod recreated by the replica leading again", func() bool {
		ps := e.pods(t, sel)
		return len(ps) == 1 && ps[0].UID != first.UID && strings.Count(log.String(), "msg=leading") >= 2
	})
	select {
	case <-run.Done():
		t.Fatalf("Run returned (%v) on losing the lease", run.Err())
	default:
	}
}

// TestDeletedServiceRecreated: the headless Service deleted by hand comes
// back from its own event (the Service informer), not from a later event
// of the deployment or a resync.
func TestDeletedServiceRecreated(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	if err := e.applyDoc(t, replaceAll(fenceDoc, "NAME", "svc")); err != nil {
		t.Fatal(err)
	}
	svcs := e.kube.CoreV1().Services(e.ns)
	var old *corev1.Service
	testutil.WaitFor(t, wait, "the deployment settled with its service", func() bool {
		md := e.md(t, "svc")
		s, err := svcs.Get(e.ctx, "svc", metav1.GetOptions{})
		old = s
		return err == nil && md.Status.ObservedGeneration == md.Generation && len(e.pods(t, labels.Set{v1alpha1.LabelDeployment: "svc"})) == 1
	})
	// Twice: the deployment's own trailing events (its status write) may
	// bring it back right after the first deletion and recreate the Service
	// even without a Service watch; after that recreation nothing else is
	// pending (its pod stays Pending, no kubelet), so only the Service's own
	// event can bring the second one back.
	for range 2 {
		if err := svcs.Delete(e.ctx, "svc", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		testutil.WaitFor(t, wait, "the service recreated", func() bool {
			s, err := svcs.Get(e.ctx, "svc", metav1.GetOptions{})
			if err == nil && s.UID != old.UID {
				old = s
				return true
			}
			return false
		})
	}
}

// TestHeldSlotQuiet: a slot whose pod name a user's pod holds costs reads
// only, pass after pass: no POST of the pod or the Service, one
// PodNameConflict event, and the PodNameConflict condition (Progressing
// False) naming the pod.
func TestHeldSlotQuiet(t *testing.T) {
	e := newEnv(t)
	holder := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "held-0-decode-1"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "user:v1"}}}}
	if _, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cnt := &requestCounter{}
	cfg := rest.CopyConfig(e.srv.Config)
	cfg.Wrap(cnt.wrap)
	ctrl := e.newTestController(t, cfg, "a", nil)
	ctrl.heldRequeue = 50 * time.Millisecond
	testutil.Run(t, "controller", ctrl.Run, nil)
	if err := e.applyDoc(t, replaceAll(fenceDoc, "NAME", "held")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the first replica", func() bool {
		return len(e.pods(t, labels.Set{v1alpha1.LabelDeployment: "held"})) == 1
	})
	// The second replica's slot is in an existing group (not a gang): held,
	// it is left empty while the rest goes on.
	if err := e.applyDoc(t, replaceAll(replaceAll(fenceDoc, "NAME", "held"), `"replicas":1`, `"replicas":2`)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the PodNameConflict condition", func() bool {
		md := e.md(t, "held")
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionPodNameConflict)
		p := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionProgressing)
		return c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "held-0-decode-1") &&
			p != nil && p.Status == metav1.ConditionFalse && p.Reason == reasonPodNameConflict
	})
	start := e.steadyFrom(t, ctrl, cnt, "held", "held-0-decode-1")
	testutil.WaitFor(t, wait, "ten more passes (reads of the held name)", func() bool {
		return cnt.count("GET", "/pods/held-0-decode-1")-start.count("GET", "/pods/held-0-decode-1") >= 10
	})
	now := cnt.snapshot()
	for _, w := range []struct{ method, path string }{{"POST", "/pods"}, {"POST", "/services"}, {"GET", "/services/held"}, {"PUT", "/modeldeployments/held/status"}} {
		if n := now.count(w.method, w.path) - start.count(w.method, w.path); n != 0 {
			t.Errorf("%d× %s …%s over ten passes of a held slot, want none", n, w.method, w.path)
		}
	}
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, ev := range evs.Items {
		if ev.Reason == reasonPodNameConflict {
			n += ev.Count
		}
	}
	if n != 1 {
		t.Errorf("%d PodNameConflict events, want 1 (one per holder, not per pass)", n)
	}

	// The holder goes: the slot is created.
	if err := e.kube.CoreV1().Pods(e.ns).Delete(e.ctx, holder.Name, metav1.DeleteOptions{GracePeriodSeconds: new(int64)}); err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the slot created and the condition False", func() bool {
		md := e.md(t, "held")
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionPodNameConflict)
		ps := e.pods(t, labels.Set{v1alpha1.LabelDeployment: "held"})
		return len(ps) == 2 && c != nil && c.Status == metav1.ConditionFalse
	})
}

// TestBackoffCapped: a deployment failing over and over (a gang refused by
// a webhook that is down) is retried at least every maxBackoff, not after
// client-go's 1000 s.
func TestBackoffCapped(t *testing.T) {
	rl := newRateLimiter()
	var last time.Duration
	for range 40 {
		last = rl.When("ns/md")
	}
	if last > 2*time.Minute {
		t.Fatalf("after 40 failures the next try waits %v; want at most 2 min", last)
	}
	if first := rl.When("ns/other"); first > time.Second {
		t.Fatalf("first retry after %v", first)
	}
}
