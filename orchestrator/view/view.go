// Package view prints kvmesh.io resources for `kvmesh get` and `kvmesh
// describe`. The API server renders the CRDs' printer columns itself (the
// Table format), so `get` shows the same READY/STATUS columns as kubectl.
package view

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// Resource resolves a name or alias to a kvmesh.io resource.
func Resource(s string) (string, error) {
	switch strings.ToLower(s) {
	case "modeldeployments", "modeldeployment", "md":
		return "modeldeployments", nil
	case "autoscalingpolicies", "autoscalingpolicy", "asp":
		return "autoscalingpolicies", nil
	case "rolescalers", "rolescaler":
		return "rolescalers", nil
	case "modelroutes", "modelroute", "mroute":
		return "modelroutes", nil
	}
	return "", fmt.Errorf("unknown resource %q (modeldeployments, autoscalingpolicies, rolescalers, modelroutes)", s)
}

func client(cfg *rest.Config) (*rest.RESTClient, error) {
	c := rest.CopyConfig(cfg)
	gv := v1alpha1.SchemeGroupVersion
	c.GroupVersion, c.APIPath = &gv, "/apis"
	c.NegotiatedSerializer = scheme.Codecs.WithoutConversion()
	return rest.RESTClientFor(c)
}

// rawResult is a request's answer and its error, with the error's Status
// decoded: a missing object says `modeldeployments.kvmesh.io "x" not found`,
// as kubectl does. DoRaw (and Raw's error) left it the generic "the server
// could not find the requested resource", which reads like a CRD that is not
// installed.
func rawResult(r rest.Result) ([]byte, error) {
	body, _ := r.Raw()
	return body, r.Error() // Error decodes the Status that Raw's error leaves as text
}

// Get prints resource in namespace (all namespaces when ns is "") as the
// API server's table, or one object when name is set. An empty list prints
// kubectl's "No resources found" line to errW instead of a bare header.
func Get(ctx context.Context, cfg *rest.Config, resource, ns, name string, w, errW io.Writer) error {
	rc, err := client(cfg)
	if err != nil {
		return err
	}
	req := rc.Get().Resource(resource).SetHeader("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	if resource == "autoscalingpolicies" {
		req = req.Param("includeObject", "Object") // every role's workload (allWorkloads)
	}
	if ns != "" {
		req = req.Namespace(ns)
	}
	if name != "" {
		req = req.Name(name)
	}
	body, err := rawResult(req.Do(ctx))
	if err != nil {
		return err
	}
	var t metav1.Table
	if err := json.Unmarshal(body, &t); err != nil {
		return fmt.Errorf("decode table: %w", err)
	}
	if resource == "autoscalingpolicies" {
		allWorkloads(&t)
	}
	if name == "" && len(t.Rows) == 0 {
		if ns == "" {
			_, err = fmt.Fprintln(errW, "No resources found")
		} else {
			_, err = fmt.Fprintf(errW, "No resources found in %s namespace.\n", ns)
		}
		return err
	}
	return printTable(w, &t, ns == "")
}

// allWorkloads fills an AutoscalingPolicy table's Workloads column with
// every role's adopted workload: the API server renders a printer column's
// first match only (the first role's). The rows must carry their objects.
func allWorkloads(t *metav1.Table) {
	col := slices.IndexFunc(t.ColumnDefinitions, func(c metav1.TableColumnDefinition) bool { return c.Name == "Workloads" })
	if col < 0 {
		return
	}
	for i, r := range t.Rows {
		var ap struct {
			Status struct {
				Roles []struct {
					Workload string `json:"workload"`
				} `json:"roles"`
			} `json:"status"`
		}
		if col >= len(r.Cells) || json.Unmarshal(r.Object.Raw, &ap) != nil {
			continue
		}
		var ws []string
		for _, role := range ap.Status.Roles {
			if role.Workload != "" && !slices.Contains(ws, role.Workload) {
				ws = append(ws, role.Workload)
			}
		}
		if len(ws) > 0 {
			t.Rows[i].Cells[col] = strings.Join(ws, ",")
		}
	}
}

func printTable(w io.Writer, t *metav1.Table, withNS bool) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	var cols []int
	var head []string
	if withNS {
		head = append(head, "NAMESPACE")
	}
	for i, c := range t.ColumnDefinitions {
		if c.Priority == 0 {
			cols = append(cols, i)
			head = append(head, strings.ToUpper(c.Name))
		}
	}
	fmt.Fprintln(tw, strings.Join(head, "\t"))
	for _, r := range t.Rows {
		var cells []string
		if withNS {
			var m metav1.PartialObjectMetadata
			_ = json.Unmarshal(r.Object.Raw, &m)
			cells = append(cells, m.Namespace)
		}
		for _, i := range cols {
			if i < len(r.Cells) {
				cells = append(cells, fmt.Sprint(cellString(r.Cells[i])))
			}
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

func cellString(v any) string {
	if v == nil {
		return "<none>"
	}
	return fmt.Sprint(v)
}

// Describe prints one object's spec and status as YAML and its events.
func Describe(ctx context.Context, cfg *rest.Config, resource, ns, name string, w io.Writer) error {
	rc, err := client(cfg)
	if err != nil {
		return err
	}
	body, err := rawResult(rc.Get().Resource(resource).Namespace(ns).Name(name).Do(ctx))
	if err != nil {
		return err
	}
	var obj map[string]any
	if err := json.Unmarshal(body, &obj); err != nil {
		return err
	}
	md, _ := obj["metadata"].(map[string]any)
	out := map[string]any{"name": md["name"], "namespace": md["namespace"], "spec": obj["spec"], "status": obj["status"]}
	y, err := yaml.Marshal(out)
	if err != nil {
		return err
	}
	if _, err := w.Write(y); err != nil {
		return err
	}
	kube, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return err
	}
	// The object's own events: the same name alone would show a same-named
	// object of another kind (an AutoscalingPolicy named after its ModelDeployment).
	about := fields.Set{"involvedObject.name": name}
	if kind, _ := obj["kind"].(string); kind != "" {
		about["involvedObject.kind"] = kind
	}
	if uid, _ := md["uid"].(string); uid != "" {
		about["involvedObject.uid"] = uid
	}
	evs, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{FieldSelector: about.AsSelector().String()})
	if err != nil {
		return nil // events are optional (RBAC may forbid them)
	}
	fmt.Fprintln(w, "events:")
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintln(tw, "  TYPE\tREASON\tCOUNT\tMESSAGE")
	for _, e := range evs.Items {
		fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\n", e.Type, e.Reason, max(e.Count, 1), e.Message)
	}
	return tw.Flush()
}
