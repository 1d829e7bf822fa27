package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/bootstrap"
)

// runBootstrap makes the installation's Secrets once (internal/bootstrap):
// the install's Job runs it; operators may run it out of cluster.
func runBootstrap(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bootstrap", stderr)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig file (empty: in-cluster service account)")
	ns := fs.String("namespace", "kvmesh", "kvmesh's namespace (NATS, ingresses)")
	engines := fs.String("engine-namespaces", "", "comma-separated namespaces of engines whose sidecars need the NATS password and gossip key")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	others := commaList(*engines)
	// An empty namespace made every path cluster-scoped (get secret
	// /kvmesh-nats); refuse it, and any name the API server would.
	var probs []string
	for _, n := range append([]string{*ns}, others...) {
		if errs := validation.IsDNS1123Label(n); len(errs) > 0 {
			probs = append(probs, fmt.Sprintf("namespace %q: %s", n, strings.Join(errs, ", ")))
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(probs, "; "))
	}
	cfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	res, err := bootstrap.Ensure(ctx, cs, *ns, others)
	if err != nil {
		return err
	}
	for _, c := range res.Created {
		fmt.Fprintln(stdout, "created", c)
	}
	for _, c := range res.Updated {
		fmt.Fprintln(stdout, "updated", c, "to", *ns+"'s value (restart the engines there to use it)")
	}
	if len(res.Mismatched) > 0 {
		// Not overwritten: the Secret is someone else's (made by hand, or
		// by another tool); the sidecars reading it cannot authenticate.
		return fmt.Errorf("these copies differ from namespace %s's values and are not labelled app.kubernetes.io/managed-by=%s, so they were left as they are: %s; "+
			"the sidecars there do not hold the installation's credentials: delete those Secrets and run kvmesh bootstrap again, or add the label to have them kept in line",
			*ns, bootstrap.ManagedBy, strings.Join(res.Mismatched, ", "))
	}
	if len(res.Created)+len(res.Updated) == 0 {
		fmt.Fprintln(stdout, "kvmesh bootstrap: every secret exists and every copy matches; nothing changed")
	}
	return nil
}
