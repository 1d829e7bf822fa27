package webhook

import (
	"context"
	"errors"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// ErrInstalledConfiguration: the configuration calls a Service, as the
// install's does (manifests/orchestrator/webhook.yaml, kept by the
// orchestrator running in the cluster). An orchestrator out of cluster
// registers a URL: written over the Service it would take every engine
// pod's admission away from the in-cluster replicas, which write their
// Service back on their next change (a tug of war), and it leaves a URL
// the install's manifest cannot replace (docs/INSTALL.md, "Upgrade").
var ErrInstalledConfiguration = errors.New("the MutatingWebhookConfiguration " + ConfigName + " is the install's webhook")

// InstalledService returns the Service ("namespace/name") the configuration
// calls, "" when it is missing or calls a URL (an out-of-cluster
// orchestrator's: an earlier run, or another replica's).
func InstalledService(ctx context.Context, kube kubernetes.Interface) (string, error) {
	c, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", nil
	} else if err != nil {
		return "", fmt.Errorf("read the webhook configuration %s: %w", ConfigName, err)
	}
	for _, w := range c.Webhooks {
		if s := w.ClientConfig.Service; s != nil {
			return s.Namespace + "/" + s.Name, nil
		}
	}
	return "", nil
}

// CheckURLTakeover is what an orchestrator registering a URL (out of
// cluster) checks before it starts: an error wrapping
// ErrInstalledConfiguration, naming the configuration and its Service, when
// the configuration calls a Service; nil when it is missing or calls a URL.
func CheckURLTakeover(ctx context.Context, kube kubernetes.Interface) error {
	svc, err := InstalledService(ctx, kube)
	if err != nil || svc == "" {
		return err
	}
	return fmt.Errorf("%w: it calls the Service %s, kept by the orchestrator in the cluster, which writes it back over a URL", ErrInstalledConfiguration, svc)
}
