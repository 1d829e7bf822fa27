package main

import (
	"context"
	"fmt"
	"io"
	"strings"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

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
	cfg, err := kubeRESTConfig(*kubeconfig)
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

// kubeRESTConfig loads a kubeconfig file, or the in-cluster config when path is "".
func kubeRESTConfig(path string) (*rest.Config, error) {
	if path == "" {
		cfg, err := rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("in-cluster config (use --kubeconfig out of cluster): %w", err)
		}
		return cfg, nil
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", path)
	if err != nil {
		return nil, fmt.Errorf("kubeconfig %s: %w", path, err)
	}
	return cfg, nil
}
