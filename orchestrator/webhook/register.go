package webhook

import (
	"bytes"
	"context"
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
// with caBundle. In cluster manifests/orchestrator/webhook.yaml creates it
// and the orchestrator may only update it: a missing one that cannot be
// created says so.
func Ensure(ctx context.Context, kube kubernetes.Interface, t Target, caBundle []byte) error {
	want := Configuration(t, caBundle)
	api := kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	cur, err := api.Get(ctx, ConfigName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, want, metav1.CreateOptions{})
		if apierrors.IsForbidden(err) {
			return fmt.Errorf("register webhook: %w (apply manifests/orchestrator): %w", ErrConfigurationMissing, err)
		}
		return wrap(err)
	}
	if err != nil {
		return wrap(err)
	}
	cur.Webhooks = want.Webhooks
	_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
	return wrap(err)
}

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

// registrar keeps the configuration trusting the certificate being served:
// it registers the CA bundle of the first certificate and of every new one,
// and again whenever the configuration stops holding it (replaced, deleted,
// its caBundle emptied: it watches the one configuration by name). It also
// decides when a certificate the source published is served: at once when
// the registered bundle trusts it (a renewal by the same CA), else only
// after a bundle holding its CAs and the served certificate's unexpired
// ones is registered, so that no handshake in between presents a
// certificate the API server does not trust (and a replica still serving
// the old one stays trusted). A served certificate that is not registered
// or no longer verifies holds nothing back. Failures are retried with
// backoff; each is logged at once and counted
// (kvmesh_webhook_registration_errors_total), and readiness fails until the
// served bundle is registered.
type registrar struct {
	kube   kubernetes.Interface
	target Target
	store  *certStore // run is the only reader of store.changed and the only caller of store.serve
	log    *slog.Logger
	// onRegistered, if set, is called after the first registration.
	onRegistered func()

	mu      sync.Mutex // guards bundle and lastErr
	bundle  []byte     // registered CA bundle; nil when not (or no longer) in place
	lastErr error      // of the last failed attempt

	servedFrom *Certs // the published certificate the served one is (run's)
	// caOverlap: how long a new CA's bundle keeps the previous CA (RunConfig).
	caOverlap time.Duration
}

// DefaultCAOverlap is RunConfig.CAOverlap's default: minutes for every
// orchestrator replica to serve the new certificate (they read the same
// files or Secret), short enough that a CA retired for a compromise is not
// trusted for the webhook for long.
const DefaultCAOverlap = 5 * time.Minute

// run registers until ctx ends; it owns the configuration's informer.
func (r *registrar) run(ctx context.Context) {
	drift := make(chan struct{}, 1)
	factory := informers.NewSharedInformerFactoryWithOptions(r.kube, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", ConfigName).String()
		}))
	inf := factory.Admissionregistration().V1().MutatingWebhookConfigurations().Informer()
	check := func(obj any) {
		served := r.store.current()
		if served == nil || bytes.Equal(heldBundle(obj), served.CABundle) {
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

	var retry <-chan time.Time   // set while a failed attempt waits for its retry
	var overlap <-chan time.Time // set while the registered bundle keeps the previous CA
	trim := false
	attempts := 0
	first := true
	for {
		select {
		case <-ctx.Done():
			return
		case <-overlap:
			overlap, trim = nil, true
		case <-r.store.changed:
		case <-drift:
			if first || !r.drifted(ctx) {
				// Not registered yet (the certificate's own signal or a retry
				// does it), or an event older than the registrar's own write.
				continue
			}
			r.log.Warn("sidecar webhook configuration changed under the orchestrator; registering again", "configuration", ConfigName)
		case <-retry:
		}
		retry = nil
		c, from := r.next(time.Now())
		if c == nil {
			continue
		}
		dropping := trim && from != nil && r.store.latest.Load() == from && !bytes.Equal(c.CABundle, from.CABundle)
		if dropping {
			c = from // the overlap is over: the served certificate's own bundle, the previous CA dropped
		}
		trim = dropping // kept for the retry should this registration fail
		if r.registered(c.CABundle) {
			r.serve(c, from)
			continue
		}
		err := Ensure(ctx, r.kube, r.target, c.CABundle)
		if ctx.Err() != nil {
			return
		}
		r.mu.Lock()
		if err != nil {
			r.lastErr = err
		} else {
			r.bundle, r.lastErr = c.CABundle, nil
		}
		r.mu.Unlock()
		if err != nil {
			wait := retryBackoff.Delay(attempts)
			attempts++
			if !r.registered(r.store.current().CABundle) {
				registered.Set(0)
			}
			registrationErrors.Inc()
			r.log.Error("sidecar webhook not registered; "+unregisteredEffect(err, r.target.FailOpen),
				"err", err, "attempt", attempts, "retryIn", wait)
			retry = time.After(wait)
			continue
		}
		r.serve(c, from)
		attempts = 0
		registered.Set(1)
		r.log.Info("sidecar webhook registered", "configuration", ConfigName, "caBundleBytes", len(c.CABundle))
		switch {
		case dropping:
			trim = false
			r.log.Info("the previous CA is dropped from the webhook's bundle: the overlap is over")
		case from != nil && !bytes.Equal(c.CABundle, from.CABundle):
			overlap = time.After(r.caOverlap)
			r.log.Info("a new CA is registered with the previous CA beside it, which is dropped from the bundle after the overlap",
				"overlap", r.caOverlap.String())
		}
		if first && r.onRegistered != nil {
			r.onRegistered()
		}
		first = false
	}
}

// next is the certificate to serve and register, and the published one it
// is made of. A published certificate the registered bundle does not trust
// is not served yet while the served one verifies and is registered: next
// returns it with the served bundle's CAs added, to be served once that
// bundle is registered. Otherwise it serves the published certificate at
// once (nil: none yet).
func (r *registrar) next(now time.Time) (c, from *Certs) {
	cur, pub := r.store.current(), r.store.latest.Load()
	if pub == nil || pub == r.servedFrom {
		return cur, r.servedFrom
	}
	if cur == nil || bytes.Equal(pub.CABundle, cur.CABundle) || !r.registered(cur.CABundle) ||
		cur.verify(cur.CABundle, now) != nil || pub.verify(cur.CABundle, now) == nil {
		r.serve(pub, pub)
		return pub, pub
	}
	staged := *pub
	staged.CABundle = withCAs(pub.CABundle, cur.CABundle, now)
	return &staged, pub
}

// serve presents c, made of the published from.
func (r *registrar) serve(c, from *Certs) {
	r.store.serve(c)
	r.servedFrom = from
}

// heldBundle is the CA bundle a configuration object holds (nil for none).
func heldBundle(obj any) []byte {
	if c, ok := obj.(*admissionregistrationv1.MutatingWebhookConfiguration); ok && len(c.Webhooks) > 0 {
		return c.Webhooks[0].ClientConfig.CABundle
	}
	return nil
}

// drifted reads the configuration and reports that it no longer holds the
// served bundle (then readiness fails until it is written again). An
// informer event can show a state older than the registrar's own write:
// the configuration as listed at start-up, before the first registration.
func (r *registrar) drifted(ctx context.Context) bool {
	served := r.store.current()
	if served == nil {
		return false
	}
	cur, err := r.kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
	if err == nil && bytes.Equal(heldBundle(cur), served.CABundle) && r.registered(served.CABundle) {
		return false
	}
	r.mu.Lock()
	r.bundle = nil // no longer in place: readiness fails until written again
	r.mu.Unlock()
	registered.Set(0)
	return true
}

func (r *registrar) registered(bundle []byte) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.bundle != nil && bytes.Equal(r.bundle, bundle)
}

// ready is nil once the served certificate verifies and its bundle is
// registered; it sets kvmesh_webhook_certificate_valid.
func (r *registrar) ready() error {
	c := r.store.current()
	if c == nil {
		return errors.New("no certificate yet")
	}
	if err := c.verify(c.CABundle, time.Now()); err != nil {
		certValid.Set(0)
		return fmt.Errorf("the served certificate does not verify: %w", err)
	}
	certValid.Set(1)
	if r.registered(c.CABundle) {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.lastErr != nil {
		return fmt.Errorf("not registered: %w", r.lastErr)
	}
	return errors.New("not registered yet")
}
