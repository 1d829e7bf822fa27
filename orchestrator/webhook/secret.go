package webhook

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
)

// SecretName is the Secret manifests/orchestrator has the orchestrator keep
// its serving certificate in.
const SecretName = "kvmesh-webhook-tls"

// AnnotationCertManager marks a Secret cert-manager issues; the orchestrator
// serves such a Secret but never writes it (cert-manager renews it).
const AnnotationCertManager = "cert-manager.io/certificate-name"

// SecretSource keeps the webhook's certificate in a kubernetes.io/tls Secret
// that every replica shares, as controller-runtime's cert rotator does:
//
//   - a Secret holding a certificate valid for Hosts (cert-manager's, an
//     operator's, or one a replica generated) is served as it is;
//   - none: a CA and a serving certificate are generated and the Secret is
//     created; when two replicas race, the loser reads the winner's, so one
//     CA is ever live;
//   - one that does not verify for Hosts, or is two thirds into its
//     lifetime, is replaced (the serving certificate is renewed with the same
//     CA when the Secret holds ca.key) through an update conditioned on its
//     resourceVersion, so again one replica wins — unless cert-manager owns
//     it: that one is left to cert-manager.
//
// The Secret is watched (by name only), so a rotation by cert-manager or by
// another replica is served at once; a timer renews before expiry.
type SecretSource struct {
	Kube            kubernetes.Interface
	Namespace, Name string
	// Hosts the certificate must be valid for: the Service's DNS names.
	Hosts []string
	Log   *slog.Logger
}

// Run implements CertSource.
func (s *SecretSource) Run(ctx context.Context, publish func(*Certs)) error {
	if len(s.Hosts) == 0 {
		return errors.New("webhook: a certificate Secret needs hosts")
	}
	poke := make(chan struct{}, 1)
	signal := func(any) {
		select {
		case poke <- struct{}{}:
		default:
		}
	}
	factory := informers.NewSharedInformerFactoryWithOptions(s.Kube, 0, informers.WithNamespace(s.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", s.Name).String()
		}))
	inf := factory.Core().V1().Secrets().Informer()
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: signal, UpdateFunc: func(_, o any) { signal(o) }, DeleteFunc: signal,
	}); err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { inf.RunWithContext(ctx) })

	fails := 0 // in a row
	timer := time.NewTimer(0)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-poke:
		case <-timer.C:
		}
		c, next, err := s.sync(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			certErrors.Inc()
			next = retryBackoff.Delay(fails)
			fails++
			logger(s.Log).Error("webhook certificate Secret", "secret", s.Namespace+"/"+s.Name, "err", err, "retryIn", next)
		} else {
			fails = 0
			publish(c)
		}
		timer.Reset(next)
	}
}

// sync makes one pass: read the Secret, create, renew or replace it when
// needed, and return the certificate to serve and when to look again.
// Conflicts (another replica wrote first) are re-read at once.
func (s *SecretSource) sync(ctx context.Context) (*Certs, time.Duration, error) {
	api := s.Kube.CoreV1().Secrets(s.Namespace)
	for range 5 {
		now := time.Now()
		sec, err := api.Get(ctx, s.Name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			data, err := s.issue(nil, false, now)
			if err != nil {
				return nil, 0, err
			}
			_, err = api.Create(ctx, &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: s.Name, Namespace: s.Namespace,
					Labels: map[string]string{"app.kubernetes.io/name": "kvmesh-orchestrator"}},
				Type: corev1.SecretTypeTLS, Data: data,
			}, metav1.CreateOptions{})
			if apierrors.IsAlreadyExists(err) {
				continue // another replica won: serve its certificate
			}
			if err != nil {
				return nil, 0, fmt.Errorf("create secret: %w", err)
			}
			logger(s.Log).Info("webhook certificate generated", "secret", s.Namespace+"/"+s.Name)
			continue
		}
		if err != nil {
			return nil, 0, fmt.Errorf("get secret: %w", err)
		}
		c, perr := parseCerts(sec.Data[KeyCert], sec.Data[KeyKey], sec.Data[KeyCA])
		var renewAt time.Time
		if perr == nil {
			renewAt, perr = c.Check(s.Hosts, now)
		}
		if perr == nil && now.Before(renewAt) {
			return c, renewAt.Sub(now), nil
		}
		if _, ok := sec.Annotations[AnnotationCertManager]; ok {
			if perr == nil { // due for renewal: cert-manager's to do; serve it meanwhile
				return c, time.Until(c.NotAfter()), nil
			}
			return nil, 0, fmt.Errorf("secret issued by cert-manager (left to it): %w", perr)
		}
		reason := "renew"
		if perr != nil {
			reason = perr.Error()
		}
		data, err := s.issue(sec.Data, perr == nil, now)
		if err != nil {
			return nil, 0, err
		}
		sec.Data = data
		if _, err := api.Update(ctx, sec, metav1.UpdateOptions{}); apierrors.IsConflict(err) {
			continue
		} else if err != nil {
			return nil, 0, fmt.Errorf("update secret: %w", err)
		}
		logger(s.Log).Warn("webhook certificate replaced", "secret", s.Namespace+"/"+s.Name, "reason", reason)
	}
	return nil, 0, errors.New("the Secret kept changing under every write")
}

// issue makes new Secret data: a serving certificate for the hosts, signed
// by the CA in old when old holds one the orchestrator made (ca.key) that is
// not due for renewal, else by a new CA. When old still served (renewal),
// its CAs that have not expired stay in ca.crt next to the new one, so the
// API server trusts the replicas that have not switched yet.
func (s *SecretSource) issue(old map[string][]byte, oldServed bool, now time.Time) (map[string][]byte, error) {
	is, err := parseIssuer(old[KeyCA], old[KeyCAKey], now)
	bundle := unexpiredPEM(old[KeyCA], now)
	if err != nil {
		if is, err = newIssuer(now); err != nil {
			return nil, err
		}
		bundle = is.certPEM
		if oldServed {
			carried := old[KeyCA]
			if len(carried) == 0 {
				carried = old[KeyCert]
			}
			bundle = append(append([]byte{}, is.certPEM...), unexpiredPEM(carried, now)...)
		}
	}
	crt, key, err := is.serving(s.Hosts, now)
	if err != nil {
		return nil, err
	}
	return map[string][]byte{KeyCert: crt, KeyKey: key, KeyCA: bundle, KeyCAKey: is.keyPEM}, nil
}
