package webhook

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// The webhook's metrics, registered by Register.
var (
	reviews = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_webhook_reviews_total", Help: "Admission reviews by outcome (injected, skipped, rejected, bad_request).",
	}, []string{"outcome"})
	registered = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_webhook_registered",
		Help: "1 when the MutatingWebhookConfiguration calls this replica (its Service, or out of cluster its URL) and its CA bundle trusts the certificate being served, else 0.",
	})
	registrationErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_webhook_registration_errors_total", Help: "Failed attempts to register the MutatingWebhookConfiguration (each is retried; a conflict with another replica's write is read again, not counted).",
	})
	registrations = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_webhook_registrations_total",
		Help: "Writes of the MutatingWebhookConfiguration by this replica (registrations, repairs, a CA dropped after the overlap). Replicas write only when it does not call them or trust their certificate: a rate that does not settle means they disagree.",
	})
	certErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_webhook_certificate_errors_total", Help: "Failed attempts to read, create or renew the serving certificate (each is retried).",
	})
	certReloads = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_webhook_certificate_loads_total", Help: "Serving certificates loaded (the first and every rotation or renewal).",
	})
	certNotAfter = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_webhook_certificate_expiry_timestamp_seconds", Help: "When the serving certificate expires (Unix time).",
	})
	certValid = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "kvmesh_webhook_certificate_valid",
		Help: "1 while the served certificate verifies against its CA bundle (unexpired, signed by it), else 0 (/readyz fails). Set when one is loaded and on every /readyz.",
	})
	tlsHandshakeErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_webhook_tls_handshake_errors_total",
		Help: "TLS handshakes with the webhook server that failed (the API server refusing the certificate served, a client leaving mid-handshake, a scanner).",
	})
)

// Register adds the webhook's metrics to r.
func Register(r prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{reviews, registered, registrations, registrationErrors, certErrors, certReloads, certNotAfter, certValid, tlsHandshakeErrors} {
		errs = append(errs, r.Register(c))
	}
	return errors.Join(errs...)
}
