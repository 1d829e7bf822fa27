package webhook

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// fakeClock is the clock a test steps.
type fakeClock = testutil.SteppedClock

func newFakeClock() *fakeClock { return testutil.NewSteppedClock(time.Now()) }

// fakeLeader is a Leader a test switches.
type fakeLeader struct {
	mu      sync.Mutex
	leading bool
	changed chan struct{}
}

func newFakeLeader(leading bool) *fakeLeader {
	return &fakeLeader{leading: leading, changed: make(chan struct{})}
}

func (l *fakeLeader) Leading() (bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.leading, l.changed
}

func (l *fakeLeader) set(leading bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.leading = leading
	close(l.changed)
	l.changed = make(chan struct{})
}

// configuration is the MutatingWebhookConfiguration as the API server has it.
func configuration(ctx context.Context, t testing.TB, admin kubernetes.Interface) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	c, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// registeredURL is the URL the configuration calls ("" for none).
func registeredURL(ctx context.Context, t testing.TB, admin kubernetes.Interface) string {
	t.Helper()
	c := configuration(ctx, t, admin)
	if len(c.Webhooks) == 0 || c.Webhooks[0].ClientConfig.URL == nil {
		return ""
	}
	return *c.Webhooks[0].ClientConfig.URL
}

func urlOf(in *instance) string { return "https://" + in.addr + Path }

// writes counts the configuration's webhook changes (its generation) and
// the replicas' writes (kvmesh_webhook_registrations_total, shared by the
// replicas of a test) from a starting point.
type writes struct {
	gen  int64
	regs float64
}

func countWrites(ctx context.Context, t testing.TB, admin kubernetes.Interface) writes {
	return writes{configuration(ctx, t, admin).Generation, promtest.ToFloat64(registrations)}
}

// since fails t unless the replicas wrote n times (each changing the
// webhook) since w, and returns the count from now.
func (w writes) since(ctx context.Context, t testing.TB, admin kubernetes.Interface, what string, n int) writes {
	t.Helper()
	now := countWrites(ctx, t, admin)
	if now.gen-w.gen != int64(n) || int(now.regs-w.regs) != n {
		t.Errorf("%s: the configuration changed %d times and the replicas wrote it %v times, want %d",
			what, now.gen-w.gen, now.regs-w.regs, n)
	}
	return now
}

// touched counts touch's writes, for a distinct label value each.
var touched int

// settled fails t unless the replicas are quiet: the configuration is
// touched (a label: an event for every replica, no change of its webhook),
// every replica decides on that version (logs that it is in place or
// stands by, having written nothing), and the configuration is still that
// version. Replicas that disagreed would write again on the event.
func settled(ctx context.Context, t testing.TB, admin kubernetes.Interface, ins ...*instance) {
	t.Helper()
	touched++
	api := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	var rv string
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		c, err := api.Get(ctx, ConfigName, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if c.Labels == nil {
			c.Labels = map[string]string{}
		}
		c.Labels["kvmesh.test/touch"] = strconv.Itoa(touched)
		c, err = api.Update(ctx, c, metav1.UpdateOptions{})
		if err == nil {
			rv = c.ResourceVersion
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	for i, in := range ins {
		testutil.WaitFor(t, time.Minute, "replica "+strconv.Itoa(i)+" to decide on the touched configuration", func() bool {
			return strings.Contains(in.log.String(), "resourceVersion="+rv+"\n")
		})
	}
	if got := configuration(ctx, t, admin).ResourceVersion; got != rv {
		t.Fatalf("the configuration was written after the replicas saw it settled (resourceVersion %s, then %s)", rv, got)
	}
}

// bundleSet is the certificates of a bundle, in order.
func bundleSet(b []byte) []string {
	var out []string
	for _, d := range pemCerts(b) {
		out = append(out, string(d))
	}
	slices.Sort(out)
	return out
}

func sameCerts(a, b []byte) bool { return slices.Equal(bundleSet(a), bundleSet(b)) }

func concat(bs ...[]byte) []byte { return bytes.Join(bs, nil) }

// TestReplicasServingDifferentCAsConverge: replicas whose certificates and
// histories differ (their own files, as a Secret read at different moments)
// share one configuration. Each writes only when it does not trust that
// replica's certificate, merging into the bundle rather than over it, so
// they converge in a bounded number of writes with every replica trusted,
// and stay quiet; a CA no longer served leaves the bundle once, after the
// overlap counted from the CA change on the registrar's clock, however
// often the configuration is written meanwhile. Every write is counted
// exactly (kvmesh_webhook_registrations_total and the configuration's
// generation).
func TestReplicasServingDifferentCAsConverge(t *testing.T) {
	s, ns, ctx, admin := webhookEnv(t, 4*time.Minute)
	kube := orchestratorIdentity(t, s, ns)
	hosts := serviceHosts(ns)
	now := time.Now()
	leaf := func(ca *testCA) (crt, key []byte) {
		return ca.issue(t, now.Add(-time.Hour), now.Add(24*time.Hour), hosts...)
	}
	caA, caB, ca3 := newTestCA(t), newTestCA(t), newTestCA(t)
	crtA, keyA := leaf(caA)
	crtB, keyB := leaf(caB)
	crt3, key3 := leaf(ca3)
	dirA, dirB := newProjected(t, crtA, keyA, caA.pem), newProjected(t, crtB, keyB, caB.pem)
	clk := newFakeClock()
	const overlap = 5 * time.Minute
	replica := func(p *projected) *instance {
		in := startWebhook(t, kube, RunConfig{Target: Target{ServiceNamespace: ns, Service: "kvmesh-orchestrator", ServicePort: 443},
			CAOverlap: overlap, clock: clk,
			Certs: &DirSource{Dir: p.dir, Hosts: hosts, Interval: 200 * time.Millisecond, PollEvery: 20 * time.Millisecond}})
		in.waitReady(t)
		return in
	}
	trusted := func(in *instance, crt []byte) bool {
		got, err := handshake(in.addr, registeredBundle(ctx, admin), hosts[0])
		return err == nil && got.Equal(firstCert(t, crt))
	}
	w := countWrites(ctx, t, admin)

	// Two replicas, two CAs: the second merges its CA in; neither writes again.
	a := replica(dirA)
	b := replica(dirB)
	if !trusted(a, crtA) || !trusted(b, crtB) {
		t.Fatalf("both replicas ready, yet the registered bundle does not trust both:\n%s", registeredBundle(ctx, admin))
	}
	settled(ctx, t, admin, a, b)
	w = w.since(ctx, t, admin, "two replicas of different CAs starting", 2)

	// Both move to a third CA, one after the other: the first registers it
	// beside the bundle it had, the second finds it trusted.
	dirA.write(t, crt3, key3, ca3.pem)
	testutil.WaitFor(t, time.Minute, "a to serve the new CA's certificate, trusted", func() bool { return trusted(a, crt3) })
	dirB.write(t, crt3, key3, ca3.pem)
	testutil.WaitFor(t, time.Minute, "b to serve the new CA's certificate, trusted", func() bool { return trusted(b, crt3) })
	settled(ctx, t, admin, a, b)
	w = w.since(ctx, t, admin, "the move to a new CA", 1)
	if !sameCerts(registeredBundle(ctx, admin), concat(ca3.pem, caA.pem, caB.pem)) {
		t.Fatal("during the overlap the bundle is not the new CA and both previous ones")
	}

	// The overlap since the CA change ends: the previous CAs leave the
	// bundle, in one write.
	clk.Step(overlap)
	testutil.WaitFor(t, time.Minute, "the previous CAs dropped from the bundle", func() bool {
		return sameCerts(registeredBundle(ctx, admin), ca3.pem)
	})
	settled(ctx, t, admin, a, b)
	w = w.since(ctx, t, admin, "the end of the overlap", 1)
	for name, in := range map[string]*instance{"a": a, "b": b} {
		if !trusted(in, crt3) {
			t.Errorf("replica %s is not trusted by the trimmed bundle", name)
		}
		if code, body := in.readyz(); code != http.StatusOK {
			t.Errorf("replica %s: /readyz %d %s", name, code, body)
		}
	}
	if n := strings.Count(a.log.String()+b.log.String(), "the previous CA is dropped"); n != 1 {
		t.Errorf("the previous CAs were dropped in %d writes, want 1", n)
	}
	// Nothing is due any more: time passing writes nothing.
	clk.Step(2 * overlap)
	settled(ctx, t, admin, a, b)
	w = w.since(ctx, t, admin, "after the overlap", 0)

	// One replica left moves to a fourth CA. Within the overlap the
	// configuration is written without it (a stale writer): it is merged back
	// once, and that write does not restart the overlap of the CA it keeps.
	b.stop()
	ca4 := newTestCA(t)
	crt4, key4 := leaf(ca4)
	dirA.write(t, crt4, key4, ca4.pem)
	testutil.WaitFor(t, time.Minute, "a to serve the fourth CA's certificate, trusted", func() bool { return trusted(a, crt4) })
	settled(ctx, t, admin, a)
	w = w.since(ctx, t, admin, "the move to a fourth CA", 1)
	clk.Step(overlap - time.Minute)
	api := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	stale := configuration(ctx, t, admin)
	stale.Webhooks[0].ClientConfig.CABundle = ca3.pem
	if _, err := api.Update(ctx, stale, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.gen++ // the stale writer's
	testutil.WaitFor(t, time.Minute, "the fourth CA merged back", func() bool {
		return sameCerts(registeredBundle(ctx, admin), concat(ca4.pem, ca3.pem))
	})
	settled(ctx, t, admin, a)
	w = w.since(ctx, t, admin, "a stale bundle written over the configuration", 1)
	clk.Step(time.Minute)
	testutil.WaitFor(t, time.Minute, "the third CA dropped an overlap after the change to the fourth", func() bool {
		return sameCerts(registeredBundle(ctx, admin), ca4.pem)
	})
	settled(ctx, t, admin, a)
	w.since(ctx, t, admin, "the end of the fourth CA's overlap", 1)
}

// TestURLRegisteredByTheLeaderOnly: out of cluster every replica has a URL
// of its own and the configuration has one. Only the leader registers its
// URL; the other stands by and says so (/readyz 503), and nobody writes
// over the other. A new leader registers its URL, the API server then calls
// it; a URL written by hand is replaced by the leader's.
func TestURLRegisteredByTheLeaderOnly(t *testing.T) {
	_, ns, ctx, admin := webhookEnv(t, 4*time.Minute)
	la, lb := newFakeLeader(true), newFakeLeader(false)
	a := startWebhook(t, admin, RunConfig{URLHost: "127.0.0.1", Leader: la})
	b := startWebhook(t, admin, RunConfig{URLHost: "127.0.0.1", Leader: lb})
	a.waitReady(t)
	standingBy := func(in *instance) bool {
		code, body := in.readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "only the leader registers")
	}
	testutil.WaitFor(t, time.Minute, "b to stand by", func() bool { return standingBy(b) })
	if got := registeredURL(ctx, t, admin); got != urlOf(a) {
		t.Fatalf("the configuration calls %s, want the leader's %s", got, urlOf(a))
	}
	testutil.WaitFor(t, time.Minute, "the API server to inject through the leader", func() bool { return injectedByAPIServer(ctx, admin, ns) })
	w := countWrites(ctx, t, admin)
	settled(ctx, t, admin, a, b)
	w = w.since(ctx, t, admin, "two replicas, one leading", 0)

	// Hand-over with both alive.
	la.set(false)
	lb.set(true)
	b.waitReady(t)
	testutil.WaitFor(t, time.Minute, "a to stand by", func() bool { return standingBy(a) })
	if got := registeredURL(ctx, t, admin); got != urlOf(b) {
		t.Fatalf("the configuration calls %s, want the new leader's %s", got, urlOf(b))
	}
	testutil.WaitFor(t, time.Minute, "the API server to inject through the new leader", func() bool { return injectedByAPIServer(ctx, admin, ns) })
	settled(ctx, t, admin, a, b)
	w = w.since(ctx, t, admin, "a hand-over", 1)

	// The leader dies; the survivor leads and registers its URL.
	b.stop()
	la.set(true)
	a.waitReady(t)
	if got := registeredURL(ctx, t, admin); got != urlOf(a) {
		t.Fatalf("the configuration calls %s, want the survivor's %s", got, urlOf(a))
	}
	testutil.WaitFor(t, time.Minute, "the API server to inject through the survivor", func() bool { return injectedByAPIServer(ctx, admin, ns) })
	settled(ctx, t, admin, a)
	w = w.since(ctx, t, admin, "the survivor leading", 1)

	// Another URL written over the leader's is replaced at once.
	api := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	c := configuration(ctx, t, admin)
	dead := "https://127.0.0.1:1" + Path
	c.Webhooks[0].ClientConfig.URL = &dead
	if _, err := api.Update(ctx, c, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	w.gen++ // the hand's
	testutil.WaitFor(t, time.Minute, "the leader's URL registered again", func() bool { return registeredURL(ctx, t, admin) == urlOf(a) })
	a.waitReady(t)
	settled(ctx, t, admin, a)
	w.since(ctx, t, admin, "a URL written over the leader's", 1)
}

// TestURLWithoutLeaderNoTugOfWar: out of cluster without a leader, the
// replica started last registers its URL and the earlier one stands by
// rather than writing its own back (they fought ~14 times a second).
// Standing by it reports itself not registered, also once the registered
// replica is gone (it cannot tell a dead replica from a live one); deleting
// the configuration has it register again.
func TestURLWithoutLeaderNoTugOfWar(t *testing.T) {
	_, ns, ctx, admin := webhookEnv(t, 3*time.Minute)
	certs, err := GenerateCerts("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	// One shared certificate, as replicas sharing --webhook-secret: only the
	// URLs differ.
	shared := func() CertSource { return fixedSource{certs} }
	a := startWebhook(t, admin, RunConfig{URLHost: "127.0.0.1", Certs: shared()})
	a.waitReady(t)
	b := startWebhook(t, admin, RunConfig{URLHost: "127.0.0.1", Certs: shared()})
	b.waitReady(t)
	testutil.WaitFor(t, time.Minute, "a to stand by", func() bool {
		code, body := a.readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "another replica registered its URL")
	})
	if got := registeredURL(ctx, t, admin); got != urlOf(b) {
		t.Fatalf("the configuration calls %s, want the later replica's %s", got, urlOf(b))
	}
	w := countWrites(ctx, t, admin)
	settled(ctx, t, admin, a, b)
	w.since(ctx, t, admin, "two replicas by URL", 0)

	b.stop()
	settled(ctx, t, admin, a)
	if code, _ := a.readyz(); code != http.StatusServiceUnavailable {
		t.Errorf("a reports ready while the configuration calls the replica that is gone")
	}
	if err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(ctx, ConfigName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	a.waitReady(t)
	if got := registeredURL(ctx, t, admin); got != urlOf(a) {
		t.Fatalf("the configuration calls %s, want %s", got, urlOf(a))
	}
	testutil.WaitFor(t, time.Minute, "the API server to inject through a", func() bool { return injectedByAPIServer(ctx, admin, ns) })
}

// fixedSource publishes one certificate.
type fixedSource struct{ c *Certs }

func (f fixedSource) Run(ctx context.Context, publish func(*Certs)) error {
	publish(f.c)
	<-ctx.Done()
	return nil
}

// racer is a transport that, before the first request matching method and
// the configuration's path goes out, lets another writer get there first.
type racer struct {
	rt     http.RoundTripper
	method string
	first  func()
	mu     sync.Mutex
	fired  bool
}

func (r *racer) raced() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fired
}

func (r *racer) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Method == r.method && strings.Contains(req.URL.Path, "/mutatingwebhookconfigurations") {
		r.mu.Lock()
		fire := !r.fired
		r.fired = true
		r.mu.Unlock()
		if fire {
			r.first()
		}
	}
	return r.rt.RoundTrip(req)
}

// TestRacingWritesAreNoFailures: another replica's write landing between
// this replica's read and its write (an update on a stale resourceVersion:
// 409; a create of a configuration created meanwhile: AlreadyExists) is
// read again and written on, not logged as an error nor counted in
// kvmesh_webhook_registration_errors_total. The API server itself answers
// the conflicts: the other writer's write is made just before the request.
func TestRacingWritesAreNoFailures(t *testing.T) {
	s, _, ctx, admin := webhookEnv(t, 3*time.Minute)
	api := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	touch := func() {
		if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
			c, err := api.Get(ctx, ConfigName, metav1.GetOptions{})
			if err != nil {
				return err
			}
			c.Labels["kvmesh.test/other-writer"] = "yes"
			_, err = api.Update(ctx, c, metav1.UpdateOptions{})
			return err
		}); err != nil {
			t.Error(err)
		}
	}
	create := func() {
		if _, err := api.Create(ctx, manifestWebhook(t), metav1.CreateOptions{}); err != nil {
			t.Error(err)
		}
	}
	for _, tc := range []struct {
		name, method string
		other        func()
		deleted      bool // the configuration does not exist at start
	}{
		{name: "update on a stale version", method: http.MethodPut, other: touch},
		{name: "create racing a create", method: http.MethodPost, other: create, deleted: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			installConfiguration(t, admin)
			if tc.deleted {
				if err := api.Delete(ctx, ConfigName, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			rc := &racer{method: tc.method, first: tc.other}
			cfg := rest.CopyConfig(s.Config)
			cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { rc.rt = rt; return rc })
			kube := kubernetes.NewForConfigOrDie(cfg)
			errs, regs := promtest.ToFloat64(registrationErrors), promtest.ToFloat64(registrations)
			in := startWebhook(t, kube, RunConfig{URLHost: "127.0.0.1"})
			in.waitReady(t)
			if !rc.raced() {
				t.Fatal("no write raced")
			}
			if got := registeredURL(ctx, t, admin); got != urlOf(in) {
				t.Fatalf("the configuration calls %s, want %s", got, urlOf(in))
			}
			if d := promtest.ToFloat64(registrationErrors) - errs; d != 0 {
				t.Errorf("kvmesh_webhook_registration_errors_total rose by %v on a race", d)
			}
			if d := promtest.ToFloat64(registrations) - regs; d != 1 {
				t.Errorf("kvmesh_webhook_registrations_total rose by %v, want 1", d)
			}
			if strings.Contains(in.log.String(), "level=ERROR") {
				t.Errorf("a race logged at error:\n%s", in.log.String())
			}
			in.stop()

			// Ensure, used by installs and tests, retries the same way.
			rc.mu.Lock()
			rc.fired = false
			rc.mu.Unlock()
			if tc.deleted {
				if err := api.Delete(ctx, ConfigName, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			if err := Ensure(ctx, kube, Target{URL: "https://127.0.0.1:1" + Path}, nil); err != nil || !rc.raced() {
				t.Errorf("Ensure on a race: %v (raced: %v)", err, rc.raced())
			}
		})
	}
}

// cutter is a transport that, while down, fails every request as an API
// server that is away does (the connection refused).
type cutter struct {
	rt   http.RoundTripper
	mu   sync.Mutex
	down bool
}

func (c *cutter) set(down bool) {
	c.mu.Lock()
	c.down = down
	c.mu.Unlock()
}

func (c *cutter) RoundTrip(req *http.Request) (*http.Response, error) {
	c.mu.Lock()
	down := c.down
	c.mu.Unlock()
	if down {
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	}
	return c.rt.RoundTrip(req)
}

// TestLeadershipLostInAnOutageIsNoRegistrationError: a replica that stops
// leading while the API server is away (its fence closed) has nothing to
// register: it stands by, logs no error and counts none in
// kvmesh_webhook_registration_errors_total, though its read of the
// configuration fails. Leading again in the outage, its failed read is
// counted, but logged as what it is, not as a new CA failing to register:
// no new certificate exists. Once the API server is back it is in place.
func TestLeadershipLostInAnOutageIsNoRegistrationError(t *testing.T) {
	s, _, ctx, admin := webhookEnv(t, 3*time.Minute)
	cut := &cutter{}
	cfg := rest.CopyConfig(s.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper { cut.rt = rt; return cut })
	kube := kubernetes.NewForConfigOrDie(cfg)
	la := newFakeLeader(true)
	in := startWebhook(t, kube, RunConfig{URLHost: "127.0.0.1", Leader: la})
	in.waitReady(t)

	errs := promtest.ToFloat64(registrationErrors)
	cut.set(true)
	la.set(false)
	testutil.WaitFor(t, time.Minute, "the replica to stand by (or log its failed attempt)", func() bool {
		code, body := in.readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(body, "only the leader registers") ||
			strings.Contains(in.log.String(), "attempt=1")
	})
	if code, body := in.readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "only the leader registers") {
		t.Errorf("readyz of a replica no longer leading: %d %q, want 503 only the leader registers", code, body)
	}
	if d := promtest.ToFloat64(registrationErrors) - errs; d != 0 {
		t.Errorf("kvmesh_webhook_registration_errors_total rose by %v on a replica not leading", d)
	}
	if strings.Contains(in.log.String(), "level=ERROR") {
		t.Errorf("a replica not leading logged an error:\n%s", in.log.String())
	}

	la.set(true)
	testutil.WaitFor(t, time.Minute, "the leader's failed read counted", func() bool { return promtest.ToFloat64(registrationErrors) > errs })
	testutil.WaitFor(t, time.Minute, "the leader's failed read logged", func() bool { return strings.Contains(in.log.String(), "attempt=1") })
	if log := in.log.String(); strings.Contains(log, "new certificate") || !strings.Contains(log, "reading or writing the configuration failed") {
		t.Errorf("a failed read, no new certificate pending, logged as:\n%s", log)
	}
	cut.set(false)
	in.waitReady(t)
	if got := registeredURL(ctx, t, admin); got != urlOf(in) {
		t.Fatalf("the configuration calls %s, want %s", got, urlOf(in))
	}
}
