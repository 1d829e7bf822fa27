package main

import (
	"context"
	"fmt"
	"io"
	"strings"

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
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%w: unexpected arguments %q", errUsage, fs.Args())
	}
	cfg, err := kubeConfig(*kubeconfig)
	if err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	var others []string
	for _, n := range strings.Split(*engines, ",") {
		if n = strings.TrimSpace(n); n != "" {
			others = append(others, n)
		}
	}
	res, err := bootstrap.Ensure(ctx, cs, *ns, others)
	if err != nil {
		return err
	}
	if len(res.Created) == 0 {
		fmt.Fprintln(stdout, "kvmesh bootstrap: every secret exists; nothing changed")
	}
	for _, c := range res.Created {
		fmt.Fprintln(stdout, "created", c)
	}
	return nil
}
