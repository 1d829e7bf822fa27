package kubetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/discovery/cached/memory"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/restmapper"
)

// ApplyOptions tune Apply.
type ApplyOptions struct {
	// Namespace is used for namespaced objects that name none.
	Namespace string
	// DryRun applies with server-side dry run (all admission, no storage).
	DryRun bool
}

// Decode splits a multi-document YAML or JSON stream into objects.
func Decode(r io.Reader) ([]*unstructured.Unstructured, error) {
	dec := utilyaml.NewYAMLOrJSONDecoder(r, 4096)
	var out []*unstructured.Unstructured
	for {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			if errors.Is(err, io.EOF) {
				return out, nil
			}
			return nil, err
		}
		if len(m) == 0 {
			continue
		}
		u := &unstructured.Unstructured{Object: m}
		if u.IsList() {
			l, err := u.ToList()
			if err != nil {
				return nil, err
			}
			for i := range l.Items {
				out = append(out, &l.Items[i])
			}
			continue
		}
		out = append(out, u)
	}
}

// ApplyFiles server-side applies every object in the files, in order; CRDs
// are waited on until Established so later objects of their kinds resolve.
func ApplyFiles(ctx context.Context, cfg *rest.Config, opts ApplyOptions, files ...string) ([]*unstructured.Unstructured, error) {
	var objs []*unstructured.Unstructured
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		o, err := Decode(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		objs = append(objs, o...)
	}
	return objs, Apply(ctx, cfg, opts, objs...)
}

// Apply server-side applies objects with field manager "kubetest".
func Apply(ctx context.Context, cfg *rest.Config, opts ApplyOptions, objs ...*unstructured.Unstructured) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	cached := memory.NewMemCacheClient(dc)
	mapper := restmapper.NewDeferredDiscoveryRESTMapper(cached)
	for _, o := range objs {
		gvk := o.GroupVersionKind()
		m, err := mapper.RESTMapping(gvk.GroupKind(), gvk.Version)
		if err != nil {
			cached.Invalidate()
			if m, err = mapper.RESTMapping(gvk.GroupKind(), gvk.Version); err != nil {
				return fmt.Errorf("%s %s: %w", gvk.Kind, o.GetName(), err)
			}
		}
		var ri dynamic.ResourceInterface = dyn.Resource(m.Resource)
		if m.Scope.Name() == meta.RESTScopeNameNamespace {
			ns := o.GetNamespace()
			if ns == "" {
				ns = opts.Namespace
			}
			if ns == "" {
				ns = "default"
			}
			ri = dyn.Resource(m.Resource).Namespace(ns)
		}
		data, err := o.MarshalJSON()
		if err != nil {
			return err
		}
		po := metav1.PatchOptions{FieldManager: "kubetest", Force: ptr(true)}
		if opts.DryRun {
			po.DryRun = []string{metav1.DryRunAll}
		}
		if _, err := ri.Patch(ctx, o.GetName(), types.ApplyPatchType, data, po); err != nil {
			return fmt.Errorf("apply %s %s: %w", gvk.Kind, o.GetName(), err)
		}
		if gvk.Kind == "CustomResourceDefinition" && !opts.DryRun {
			if err := waitEstablished(ctx, dyn, o.GetName()); err != nil {
				return err
			}
			cached.Invalidate()
		}
	}
	return nil
}

var crdGVR = schema.GroupVersionResource{Group: "apiextensions.k8s.io", Version: "v1", Resource: "customresourcedefinitions"}

func waitEstablished(ctx context.Context, dyn dynamic.Interface, name string) error {
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
		u, err := dyn.Resource(crdGVR).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, nil
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			cm, _ := c.(map[string]any)
			if cm["type"] == "Established" && cm["status"] == "True" {
				return true, nil
			}
		}
		return false, nil
	})
}

func ptr[T any](v T) *T { return &v }
