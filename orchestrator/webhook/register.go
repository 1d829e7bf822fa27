package webhook

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/retry"
)

// ConfigName is the MutatingWebhookConfiguration's name.
const ConfigName = "kvmesh-sidecar-injector"

// Target is where the API server calls the webhook: a URL (out of cluster,
// e.g. https://127.0.0.1:9443/mutate-pods) or a Service.
type Target struct {
	URL                       string
	ServiceNamespace, Service string
	ServicePort               int32
	// FailOpen admits pods uninjected when the webhook is down (Ignore);
	// the default (Fail) rejects them, since an engine without its sidecar
	// is invisible to the router.
	FailOpen bool
}

// Configuration builds the MutatingWebhookConfiguration.
func Configuration(t Target, caBundle []byte) *admissionregistrationv1.MutatingWebhookConfiguration {
	cc := admissionregistrationv1.WebhookClientConfig{CABundle: caBundle}
	if t.URL != "" {
		u := t.URL
		cc.URL = &u
	} else {
		p, port := Path, t.ServicePort
		cc.Service = &admissionregistrationv1.ServiceReference{Namespace: t.ServiceNamespace, Name: t.Service, Path: &p, Port: &port}
	}
	fail := admissionregistrationv1.Fail
	if t.FailOpen {
		fail = admissionregistrationv1.Ignore
	}
	// Every field the API server would default is written with its default,
	// as manifests/orchestrator/webhook.yaml writes it: a server-side apply
	// of the manifest over a configuration the orchestrator created (an
	// upgrade from a release that did not ship the manifest) compares the
	// atomic rules list whole, and a defaulted scope the manifest lacked
	// was a conflict.
	none := admissionregistrationv1.SideEffectClassNone
	reinvoke := admissionregistrationv1.IfNeededReinvocationPolicy
	equivalent := admissionregistrationv1.Equivalent
	scope := admissionregistrationv1.AllScopes
	timeout := int32(10)
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: ConfigName, Labels: map[string]string{"app.kubernetes.io/name": "kvmesh-orchestrator"}},
		Webhooks: []admissionregistrationv1.MutatingWebhook{{
			Name:                    "sidecar.kvmesh.io",
			ClientConfig:            cc,
			AdmissionReviewVersions: []string{"v1"},
			SideEffects:             &none,
			FailurePolicy:           &fail,
			ReinvocationPolicy:      &reinvoke,
			TimeoutSeconds:          &timeout,
			MatchPolicy:             &equivalent,
			NamespaceSelector:       &metav1.LabelSelector{},
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{LabelInject: "true"}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"}, Scope: &scope,
				},
			}},
		}},
	}
}

// Ensure creates or updates the configuration so the API server calls t
// with caBundle, whatever it held. In cluster manifests/orchestrator/webhook.yaml
// creates it and the orchestrator may only update it: a missing one that
// cannot be created says so. A write that races another writer's (a
// conflict on the resourceVersion, or a create that finds the
// configuration created meanwhile) is made again from a fresh read.
func Ensure(ctx context.Context, kube kubernetes.Interface, t Target, caBundle []byte) error {
	want := Configuration(t, caBundle)
	api := kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	return retry.OnError(retry.DefaultRetry, isConflict, func() error {
		cur, err := api.Get(ctx, ConfigName, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			cur = nil
		} else if err != nil {
			return wrap(err)
		}
		_, err = writeConfiguration(ctx, kube, cur, want)
		return err
	})
}

// writeConfiguration replaces cur's webhooks by want's, conditioned on
// cur's resourceVersion, or creates want when cur is nil. Errors are
// wrapped; a conflict stays one (isConflict).
func writeConfiguration(ctx context.Context, kube kubernetes.Interface, cur, want *admissionregistrationv1.MutatingWebhookConfiguration) (*admissionregistrationv1.MutatingWebhookConfiguration, error) {
	api := kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if cur == nil {
		got, err := api.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) {
			return nil, fmt.Errorf("register webhook: %w (apply manifests/orchestrator): %w", ErrConfigurationMissing, err)
		}
		return got, wrap(err)
	}
	upd := cur.DeepCopy()
	upd.Webhooks = want.Webhooks
	got, err := api.Update(ctx, upd, metav1.UpdateOptions{})
	return got, wrap(err)
}

// isConflict: another writer got there first (an update on a stale
// resourceVersion, a create of a configuration created meanwhile). Not a
// failure: read again and decide again.
func isConflict(err error) bool { return apierrors.IsConflict(err) || apierrors.IsAlreadyExists(err) }

// ErrConfigurationMissing: the MutatingWebhookConfiguration does not exist
// and the orchestrator may not create it. The API server then calls no
// webhook: pods are admitted without the sidecar.
var ErrConfigurationMissing = errors.New("the webhook configuration " + ConfigName + " is missing")

// unregisteredEffect says what happens to pods asking for the sidecar while
// registering fails with err: without the configuration they are admitted
// uninjected; with one that does not trust the served certificate the API
// server's call fails, which rejects them unless the policy fails open.
func unregisteredEffect(err error, failOpen bool) string {
	switch {
	case errors.Is(err, ErrConfigurationMissing):
		return "no webhook is called: pods asking for the sidecar are admitted without it until it is"
	case failOpen:
		return "pods asking for the sidecar are admitted without it (failure policy Ignore) until it is"
	}
	return "pods asking for the sidecar are rejected until it is"
}

func wrap(err error) error {
	if err != nil {
		return fmt.Errorf("register webhook: %w", err)
	}
	return nil
}

// Leader says whether this replica leads (RunConfig.Leader).
type Leader interface {
	// Leading reports whether this replica leads now, and a channel closed
	// at the next change.
	Leading() (bool, <-chan struct{})
}

// clock is the registrar's, which paces the CA overlap (and says what
// is expired): time's in production, a fake a test steps.
type clock interface {
	Now() time.Time
	// After returns a channel that receives once d has passed.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// registrar keeps the configuration calling this replica and trusting the
// certificate it serves, beside the other replicas doing the same:
//
//   - The configuration is in place for a replica when its clientConfig
//     names the replica's target (the Service, or its URL) and its caBundle
//     trusts the replica's served certificate (and chain). Only a
//     configuration that is not is written, and /readyz and
//     kvmesh_webhook_registered say whether it is. Bytes that differ are no
//     reason: replicas whose histories differ (one saw a CA the other never
//     served) never agree on bytes, and wrote over each other for ever.
//   - A write merges: it keeps the unexpired certificates of the
//     configuration's bundle (another replica may serve one) beside this
//     replica's, so two replicas serving certificates of different CAs
//     converge on a bundle trusting both in two writes.
//   - A CA leaves the bundle once, caOverlap after this replica first saw it
//     no longer its own (the served certificate's CAs; a CA another replica
//     registered counts from when it was first seen), measured on the
//     registrar's clock and keyed by the CA's certificate: a later write,
//     this replica's or another's, does not restart it. A trim is made once
//     per CA: a replica that still serves that CA registers it again, and is
//     left alone then (it drops it itself once it moves on).
//   - A new certificate the configuration does not trust yet is served only
//     once a bundle holding its CAs and the served certificate's is
//     registered, so no handshake in between presents a certificate the API
//     server does not trust (and a replica still serving the old one stays
//     trusted). A served certificate that is not in place or no longer
//     verifies holds nothing back.
//   - Out of cluster each replica has a URL of its own and the configuration
//     one: with a leader (RunConfig.Leader) only the leader registers its
//     URL, again on each new term, and the others stand by; without one a
//     replica registers its URL at start and stands by once another replica
//     registers its own over it (until the configuration is deleted). A
//     replica standing by reports itself not registered.
//
// It watches the one configuration by name and reads it before each
// decision. A write is conditioned on the resourceVersion read, so a
// replica never writes over a configuration it has not seen; a conflict is
// read again at once and not counted as a failure. Failures are retried with
// backoff; each is logged at once and counted
// (kvmesh_webhook_registration_errors_total); each write is counted
// (kvmesh_webhook_registrations_total).
type registrar struct {
	kube   kubernetes.Interface
	target Target
	store  *certStore // run is the only reader of store.changed and the only caller of store.serve
	log    *slog.Logger
	clock  clock
	// leader, for a URL target: only while it leads is the URL registered
	// (nil: at start, until another replica's URL replaces it).
	leader Leader
	// onRegistered, if set, is called once the configuration is first in place.
	onRegistered func()
	// caOverlap: how long a CA no longer this replica's stays in the bundle (RunConfig).
	caOverlap time.Duration

	mu      sync.Mutex // guards the three below
	inPlace bool       // as of the last read or write
	lastErr error      // of the last failed attempt (nil after a success)
	standby string     // why this replica does not register, while it does not

	// run's alone:
	held        *admissionregistrationv1.MutatingWebhookConfiguration // as last read or written (nil: none)
	own         map[string]bool                                       // the certificates of the bundle this replica registers
	retired     map[string]time.Time                                  // a certificate not own, in the bundle: since when
	trimmed     map[string]bool                                       // dropped once already by this replica
	everInPlace bool
	yielded     bool // (URL, no leader) another replica's URL replaced this one's
}

// DefaultCAOverlap is RunConfig.CAOverlap's default: minutes for every
// orchestrator replica to serve the new certificate (they read the same
// files or Secret), short enough that a CA retired for a compromise is not
// trusted for the webhook for long.
const DefaultCAOverlap = 5 * time.Minute

// leaderOnly is why a replica that does not lead stands by (followed by
// what the configuration calls).
const leaderOnly = "out of cluster only the leader registers its URL; the configuration calls "

// conflictRetries bounds the fresh reads one attempt makes after conflicts
// before it waits for a retry.
const conflictRetries = 5

// run registers until ctx ends; it owns the configuration's informer.
func (r *registrar) run(ctx context.Context) {
	r.own, r.retired, r.trimmed = map[string]bool{}, map[string]time.Time{}, map[string]bool{}
	drift := make(chan struct{}, 1)
	factory := informers.NewSharedInformerFactoryWithOptions(r.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ConfigName).String()
		}))
	inf := factory.Admissionregistration().V1().MutatingWebhookConfigurations().Informer()
	check := func(obj any) {
		served := r.store.current()
		if served == nil {
			return // nothing served yet: the certificate's own signal registers it
		}
		c, _ := obj.(*admissionregistrationv1.MutatingWebhookConfiguration)
		r.mu.Lock()
		was := r.inPlace
		r.mu.Unlock()
		if was && r.calls(c) && trusts(bundleOf(c), served, r.clock.Now()) {
			r.log.Debug("sidecar webhook configuration in place", "resourceVersion", c.ResourceVersion)
			return
		}
		select { // run reads the configuration again: the event may predate its own write
		case drift <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: check, UpdateFunc: func(_, o any) { check(o) }, DeleteFunc: func(any) { check(nil) },
	}); err != nil {
		r.log.Error("watch the webhook configuration", "err", err)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	wg.Go(func() { inf.RunWithContext(ctx) })

	var retryC <-chan time.Time // set while a failed attempt waits for its retry
	var trimC <-chan time.Time  // set while a CA waits to leave the bundle
	var trimAt time.Time        // when trimC fires
	var leaderC <-chan struct{} // closed at the leader's next change
	attempts := 0
	for {
		byDrift := false
		select {
		case <-ctx.Done():
			return
		case <-r.store.changed:
		case <-drift:
			byDrift = true
		case <-retryC:
		case <-trimC:
			trimC, trimAt = nil, time.Time{}
		case <-leaderC:
		}
		retryC = nil
		var err error
		for n := 0; ; n++ {
			leaderC, err = r.step(ctx, byDrift && n == 0)
			if !isConflict(err) || n == conflictRetries || ctx.Err() != nil {
				break
			}
		}
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			wait := retryBackoff.Delay(attempts)
			attempts++
			retryC = time.After(wait) // the real clock's: the registrar's paces the overlap alone
			if isConflict(err) {
				r.log.Info("sidecar webhook configuration keeps changing under this replica's writes; reading it again", "err", err, "retryIn", wait)
			} else {
				registrationErrors.Inc()
				r.logFailure(err, attempts, wait)
			}
		} else {
			attempts = 0
		}
		if at := r.nextTrim(); !at.Equal(trimAt) {
			trimAt, trimC = at, nil
			if !at.IsZero() {
				trimC = r.clock.After(at.Sub(r.clock.Now()))
			}
		}
	}
}

// logFailure logs a failed attempt with what it means for engine pods.
func (r *registrar) logFailure(err error, attempts int, wait time.Duration) {
	r.mu.Lock()
	inPlace := r.inPlace
	r.mu.Unlock()
	switch {
	case inPlace && r.store.latest.Load() != r.store.current():
		r.log.Error("sidecar webhook: registering the new certificate's CA failed; the certificate the configuration trusts stays served meanwhile",
			"err", err, "attempt", attempts, "retryIn", wait)
		return
	case inPlace:
		// No new certificate waits: the configuration, as last read, calls
		// this replica and trusts what it serves; pods are injected as
		// before while the API server is away.
		r.log.Warn("sidecar webhook: reading or writing the configuration failed; as last read it calls this replica and trusts the served certificate, so injection goes on",
			"err", err, "attempt", attempts, "retryIn", wait)
		return
	}
	r.log.Error("sidecar webhook not registered; "+unregisteredEffect(err, r.target.FailOpen), "err", err, "attempt", attempts, "retryIn", wait)
}

// step reads the configuration and writes it when this replica should
// register and it is not in place (or a CA is due to leave it). It returns
// the leader's change channel (nil without a leader) and the attempt's
// error; a conflict asks for another step at once. warn: the step follows
// a change of the configuration.
func (r *registrar) step(ctx context.Context, warn bool) (<-chan struct{}, error) {
	claim, leaderC := true, (<-chan struct{})(nil)
	if r.target.URL != "" && r.leader != nil {
		claim, leaderC = r.leader.Leading()
	}
	if r.store.latest.Load() == nil {
		return leaderC, nil // nothing to serve yet
	}
	obj, err := r.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
	// The certificate and the time this step decides on are taken once the
	// configuration is read: a read held up by a slow API server would
	// otherwise date a CA's retirement, and start its overlap, from before
	// the certificate that retired it was published.
	pub, now := r.store.latest.Load(), r.clock.Now()
	switch {
	case apierrors.IsNotFound(err):
		obj = nil
	case err != nil:
		if r.store.current() == nil {
			r.serve(pub, nil, now) // nothing better to present
		}
		if !claim {
			// A replica that does not lead registers nothing, so a failed
			// read (the API server away, as when the leader's fence closed)
			// is no failed registration: it stands by, and reads again at
			// its next event (a new term, the informer's relist).
			r.log.Debug("sidecar webhook standing by; reading the configuration failed", "err", err)
			r.setState(false, nil, leaderOnly+calledAt(r.held)+" as last read")
			return leaderC, nil
		}
		r.setState(r.calls(r.held) && trusts(bundleOf(r.held), r.store.current(), now), err, "")
		return leaderC, wrap(err)
	}
	r.held = obj

	standby := ""
	switch {
	case !claim:
		standby = leaderOnly + calledAt(obj)
	case r.target.URL != "" && r.leader == nil:
		if obj == nil {
			r.yielded = false
		} else if u := obj.Webhooks; len(u) > 0 && u[0].ClientConfig.URL != nil && *u[0].ClientConfig.URL != r.target.URL && r.everInPlace {
			r.yielded = true
		}
		if r.yielded {
			standby = "another replica registered its URL over this one's (" + calledAt(obj) +
				"); out of cluster one replica is called, and without a leader to say which this one gives way: restart it, or delete the configuration, to register it again"
		}
	}
	c, bundle, staged := r.next(now, pub, obj, standby != "")
	r.noteCAs(now, bundle, obj)
	if standby != "" {
		r.log.Debug("sidecar webhook standing by", "reason", standby, "resourceVersion", resourceVersion(obj))
		r.setState(false, nil, standby)
		return leaderC, nil
	}
	due := r.due(now, obj)
	if r.calls(obj) && !staged && trusts(bundleOf(obj), c, now) && len(due) == 0 {
		r.log.Debug("sidecar webhook configuration in place", "resourceVersion", resourceVersion(obj))
		r.setState(true, nil, "")
		return leaderC, nil
	}
	if warn && r.everInPlace && !(r.calls(obj) && trusts(bundleOf(obj), c, now)) {
		r.log.Warn("sidecar webhook configuration changed under the orchestrator; registering again", "configuration", ConfigName, "calls", calledAt(obj))
	}
	var keep []byte
	if r.calls(obj) {
		keep = bundleOf(obj)
	}
	want := mergeBundles(bundle, keep, due, now)
	got, err := writeConfiguration(ctx, r.kube, obj, Configuration(r.target, want))
	if err != nil {
		if !isConflict(err) {
			r.setState(r.calls(obj) && trusts(bundleOf(obj), r.store.current(), now), err, "")
		}
		return leaderC, err
	}
	registrations.Inc()
	r.held = got
	for fp := range due {
		r.trimmed[fp] = true
	}
	if staged {
		r.serve(c, got, now)
	}
	r.log.Info("sidecar webhook registered", "configuration", ConfigName, "at", calledAt(got), "caBundleBytes", len(want))
	switch {
	case staged:
		r.log.Info("a new CA is registered with the previous CA beside it, which is dropped from the bundle after the overlap",
			"overlap", r.caOverlap.String())
	case len(due) > 0:
		r.log.Info("the previous CA is dropped from the webhook's bundle: the overlap is over", "dropped", len(due))
	}
	r.setState(trusts(want, r.store.current(), now), nil, "")
	return leaderC, nil
}

// next is the certificate to serve, the bundle to register it with, and
// whether it waits for that bundle (staged). The published certificate is
// served at once when the configuration trusts it already (a renewal by
// the same CA, or another replica registered its CA), or when what is
// served is not worth keeping (nothing, or a certificate that no longer
// verifies or is not in place, or a replica standing by, which registers
// nothing); otherwise it waits, and its bundle carries the served
// certificate's CAs.
func (r *registrar) next(now time.Time, pub *Certs, obj *admissionregistrationv1.MutatingWebhookConfiguration, standby bool) (c *Certs, bundle []byte, staged bool) {
	cur := r.store.current()
	if pub == cur {
		return cur, cur.CABundle, false
	}
	held := bundleOf(obj)
	if !r.calls(obj) {
		held = nil
	}
	if standby || cur == nil || bytes.Equal(pub.CABundle, cur.CABundle) || !trusts(held, cur, now) ||
		cur.verify(cur.CABundle, now) != nil || trusts(held, pub, now) {
		r.serve(pub, obj, now)
		return pub, pub.CABundle, false
	}
	return pub, withCAs(pub.CABundle, cur.CABundle, now), true
}

// serve presents c from the next handshake on; obj is the configuration as
// known then (for the bookkeeping of the CAs that c's replaces).
func (r *registrar) serve(c *Certs, obj *admissionregistrationv1.MutatingWebhookConfiguration, now time.Time) {
	r.store.serve(c)
	r.noteCAs(now, c.CABundle, obj)
}

// noteCAs records own as the bundle this replica registers, and the time
// each other certificate of the configuration's bundle was first seen not
// own (when its overlap starts).
func (r *registrar) noteCAs(now time.Time, own []byte, obj *admissionregistrationv1.MutatingWebhookConfiguration) {
	r.own = map[string]bool{}
	for _, b := range pemCerts(own) {
		r.own[string(b)] = true
		delete(r.retired, string(b))
		delete(r.trimmed, string(b))
	}
	if !r.calls(obj) {
		return
	}
	for _, b := range pemCerts(bundleOf(obj)) {
		if _, ok := r.retired[string(b)]; !ok && !r.own[string(b)] {
			r.retired[string(b)] = now
		}
	}
}

// due is the certificates of the configuration's bundle this replica drops
// now: not its own, seen for the overlap, not dropped before.
func (r *registrar) due(now time.Time, obj *admissionregistrationv1.MutatingWebhookConfiguration) map[string]bool {
	out := map[string]bool{}
	if !r.calls(obj) {
		return out
	}
	for _, b := range pemCerts(bundleOf(obj)) {
		if since, ok := r.retired[string(b)]; ok && !r.own[string(b)] && !r.trimmed[string(b)] && !now.Before(since.Add(r.caOverlap)) {
			out[string(b)] = true
		}
	}
	return out
}

// nextTrim is when the next certificate of the registered bundle is due to
// leave it (zero: none).
func (r *registrar) nextTrim() time.Time {
	var at time.Time
	if !r.calls(r.held) {
		return at
	}
	for _, b := range pemCerts(bundleOf(r.held)) {
		since, ok := r.retired[string(b)]
		if !ok || r.own[string(b)] || r.trimmed[string(b)] {
			continue
		}
		if t := since.Add(r.caOverlap); at.IsZero() || t.Before(at) {
			at = t
		}
	}
	return at
}

// setState records whether the configuration is in place for this replica,
// the last error and why it stands by; kvmesh_webhook_registered follows.
func (r *registrar) setState(inPlace bool, err error, standby string) {
	r.mu.Lock()
	r.inPlace, r.lastErr, r.standby = inPlace, err, standby
	r.mu.Unlock()
	if !inPlace {
		registered.Set(0)
		return
	}
	registered.Set(1)
	if !r.everInPlace {
		r.everInPlace = true
		if r.onRegistered != nil {
			r.onRegistered()
		}
	}
}

// calls reports whether the configuration's webhook calls this replica's
// target (its URL, or its Service on the webhook's path and port).
func (r *registrar) calls(obj *admissionregistrationv1.MutatingWebhookConfiguration) bool {
	if obj == nil || len(obj.Webhooks) == 0 {
		return false
	}
	cc := obj.Webhooks[0].ClientConfig
	if r.target.URL != "" {
		return cc.Service == nil && cc.URL != nil && *cc.URL == r.target.URL
	}
	s := cc.Service
	if cc.URL != nil || s == nil {
		return false
	}
	port, want := int32(443), r.target.ServicePort
	if s.Port != nil {
		port = *s.Port
	}
	if want == 0 {
		want = 443
	}
	return s.Namespace == r.target.ServiceNamespace && s.Name == r.target.Service && port == want && s.Path != nil && *s.Path == Path
}

// calledAt names what the configuration's webhook calls.
func calledAt(obj *admissionregistrationv1.MutatingWebhookConfiguration) string {
	switch {
	case obj == nil:
		return "(no configuration)"
	case len(obj.Webhooks) == 0:
		return "(no webhook)"
	}
	cc := obj.Webhooks[0].ClientConfig
	if cc.URL != nil {
		return *cc.URL
	}
	if s := cc.Service; s != nil {
		return "service " + s.Namespace + "/" + s.Name
	}
	return "(nothing)"
}

func resourceVersion(obj *admissionregistrationv1.MutatingWebhookConfiguration) string {
	if obj == nil {
		return ""
	}
	return obj.ResourceVersion
}

// bundleOf is the CA bundle a configuration object holds (nil for none).
func bundleOf(obj *admissionregistrationv1.MutatingWebhookConfiguration) []byte {
	if obj != nil && len(obj.Webhooks) > 0 {
		return obj.Webhooks[0].ClientConfig.CABundle
	}
	return nil
}

// trusts reports whether bundle trusts c's chain at now, the API server's
// verdict on a handshake. For a certificate that verifies against nothing
// (expired, say: /readyz says so) it is whether bundle holds c's bundle,
// so that such a certificate is not registered again on every event.
func trusts(bundle []byte, c *Certs, now time.Time) bool {
	if c == nil || len(bundle) == 0 {
		return false
	}
	if c.verify(bundle, now) == nil {
		return true
	}
	if c.verify(c.CABundle, now) == nil {
		return false
	}
	have := map[string]bool{}
	for _, b := range pemCerts(bundle) {
		have[string(b)] = true
	}
	want := pemCerts(c.CABundle)
	for _, b := range want {
		if !have[string(b)] {
			return false
		}
	}
	return len(want) > 0
}

// pemCerts is the DER of each CERTIFICATE block of a PEM bundle.
func pemCerts(bundle []byte) [][]byte {
	var out [][]byte
	for rest := bundle; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			return out
		}
		if b.Type == "CERTIFICATE" {
			out = append(out, b.Bytes)
		}
	}
}

// mergeBundles is own followed by the certificates of keep that are
// unexpired at now, not in own and not dropped (in drop, by DER).
func mergeBundles(own, keep []byte, drop map[string]bool, now time.Time) []byte {
	have := map[string]bool{}
	for _, b := range pemCerts(own) {
		have[string(b)] = true
	}
	out := bytes.Clone(own)
	for _, b := range pemCerts(keep) {
		if have[string(b)] || drop[string(b)] {
			continue
		}
		c, err := x509.ParseCertificate(b)
		if err != nil || !now.Before(c.NotAfter) {
			continue
		}
		have[string(b)] = true
		if len(out) > 0 && out[len(out)-1] != '\n' {
			out = append(out, '\n')
		}
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: b})...)
	}
	return out
}

// ready is nil once the served certificate verifies and the configuration
// is in place for this replica; it sets kvmesh_webhook_certificate_valid.
func (r *registrar) ready() error {
	c := r.store.current()
	if c == nil {
		return errors.New("no certificate yet")
	}
	if err := c.verify(c.CABundle, r.clock.Now()); err != nil {
		certValid.Set(0)
		return fmt.Errorf("the served certificate does not verify: %w", err)
	}
	certValid.Set(1)
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.inPlace:
		return nil
	case r.standby != "":
		return errors.New("not registered: " + r.standby)
	case r.lastErr != nil:
		return fmt.Errorf("not registered: %w", r.lastErr)
	}
	return errors.New("not registered yet")
}
