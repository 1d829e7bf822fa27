package webhook

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
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
	none := admissionregistrationv1.SideEffectClassNone
	reinvoke := admissionregistrationv1.IfNeededReinvocationPolicy
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
			ObjectSelector:          &metav1.LabelSelector{MatchLabels: map[string]string{LabelInject: "true"}},
			Rules: []admissionregistrationv1.RuleWithOperations{{
				Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
				Rule: admissionregistrationv1.Rule{
					APIGroups: []string{""}, APIVersions: []string{"v1"}, Resources: []string{"pods"},
				},
			}},
		}},
	}
}

// Ensure creates or updates the configuration so the API server calls t
// with caBundle.
func Ensure(ctx context.Context, kube kubernetes.Interface, t Target, caBundle []byte) error {
	want := Configuration(t, caBundle)
	api := kube.AdmissionregistrationV1().MutatingWebhookConfigurations()
	cur, err := api.Get(ctx, ConfigName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		_, err = api.Create(ctx, want, metav1.CreateOptions{})
		return wrap(err)
	}
	if err != nil {
		return wrap(err)
	}
	cur.Webhooks = want.Webhooks
	_, err = api.Update(ctx, cur, metav1.UpdateOptions{})
	return wrap(err)
}

func wrap(err error) error {
	if err != nil {
		return fmt.Errorf("register webhook: %w", err)
	}
	return nil
}
