package modelroutes

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kvmesh/kvmesh/ingress/routes"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// entry is one ModelRoute of a namespace as planned.
type entry struct {
	name     string
	obj      *unstructured.Unstructured // as listed; nil for File's typed routes
	priority int32                      // spec.priority (0 when the object does not decode)
	spec     routes.RouteSpec
	invalid  error // why the route stays out of the file
	position int   // index in the file, when valid
	excess   bool  // valid, but past the file's routes.MaxRoutes
}

// plan is a namespace's routes in file order (valid ones first, in their
// file positions; the invalid after, by name).
type plan struct{ entries []entry }

// planRoutes decodes, validates and orders a namespace's ModelRoutes.
func planRoutes(objs []runtime.Object) plan {
	var p plan
	for _, o := range objs {
		u, ok := o.(*unstructured.Unstructured)
		if !ok {
			continue
		}
		var mr v1alpha1.ModelRoute
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &mr); err != nil {
			p.entries = append(p.entries, entry{name: u.GetName(), obj: u, invalid: fmt.Errorf("decode: %w", err)})
			continue
		}
		e := newEntry(&mr)
		e.obj = u
		p.entries = append(p.entries, e)
	}
	p.order()
	return p
}

// newEntry validates one route with the ingress's rules.
func newEntry(mr *v1alpha1.ModelRoute) entry {
	e := entry{name: mr.Name, priority: mr.Spec.Priority}
	one := routes.Config{APIVersion: routes.APIVersion, Kind: routes.Kind, Routes: []routes.RouteSpec{routeSpec(mr)}}
	one.Defaults()
	e.invalid = one.Validate()
	e.spec = one.Routes[0]
	return e
}

// order sorts the valid routes by priority (higher first), then name, ahead
// of the invalid ones, and numbers the positions.
func (p *plan) order() {
	slices.SortFunc(p.entries, func(a, b entry) int {
		if (a.invalid == nil) != (b.invalid == nil) {
			if a.invalid == nil {
				return -1
			}
			return 1
		}
		return cmp.Or(cmp.Compare(b.priority, a.priority), strings.Compare(a.name, b.name))
	})
	for i := range p.entries {
		e := &p.entries[i]
		e.position = i
		e.excess = e.invalid == nil && i >= routes.MaxRoutes
	}
}

// File renders routes as the controller does, for the local backend: the
// file of the valid ones in order, and every invalid route's problem. from
// says where they came from (the file's header comment).
func File(from string, rs []v1alpha1.ModelRoute) (string, error) {
	var p plan
	for i := range rs {
		p.entries = append(p.entries, newEntry(&rs[i]))
	}
	p.order()
	var errs []error
	for _, e := range p.entries {
		switch {
		case e.invalid != nil:
			errs = append(errs, fmt.Errorf("ModelRoute %q: %w", e.name, e.invalid))
		case e.excess:
			errs = append(errs, fmt.Errorf("ModelRoute %q: past the %d routes a route file holds", e.name, routes.MaxRoutes))
		}
	}
	data, err := p.render(from)
	return data, errors.Join(append(errs, err)...)
}

// routeSpec maps a ModelRoute onto the ingress's rule; the route is named
// after the object.
func routeSpec(mr *v1alpha1.ModelRoute) routes.RouteSpec {
	s := mr.Spec
	r := routes.RouteSpec{Name: mr.Name, Match: routes.Match{Model: s.Match.Model, Headers: s.Match.Headers, PathPrefix: s.Match.PathPrefix},
		Fallback: s.Fallback, LoRAAdapters: s.LoRAAdapters}
	for _, b := range s.Backends {
		be := routes.Backend{Model: b.Model}
		if b.Weight != nil {
			w := int(*b.Weight)
			be.Weight = &w
		}
		r.Backends = append(r.Backends, be)
	}
	if rl := s.RateLimit; rl != nil {
		r.RateLimit = routes.RateLimit{RequestsPerMinute: int(rl.RequestsPerMinute), InputTokensPerMinute: int(rl.InputTokensPerMinute)}
	}
	return r
}

// accepted is the number of routes the file holds.
func (p plan) accepted() int {
	n := 0
	for _, e := range p.entries {
		if e.invalid == nil && !e.excess {
			n++
		}
	}
	return n
}

// render is the route file: one RouteConfig of the valid routes in order,
// checked with the ingress's own parser.
func (p plan) render(from string) (string, error) {
	c := routes.Config{APIVersion: routes.APIVersion, Kind: routes.Kind, Routes: []routes.RouteSpec{}}
	for _, e := range p.entries {
		if e.invalid == nil && !e.excess {
			c.Routes = append(c.Routes, e.spec)
		}
	}
	b, err := yaml.Marshal(&c)
	if err != nil {
		return "", err
	}
	data := "# Written by the kvmesh orchestrator from the ModelRoutes of " + from + "; edit those, not this.\n" + string(b)
	if _, err := routes.Parse([]byte(data)); err != nil {
		return "", err
	}
	return data, nil
}

// writeStatus updates e's status when it changed: Accepted, Programmed,
// the ConfigMap and the position.
func (c *Controller) writeStatus(ctx context.Context, e *entry, programmed bool, why notProgrammed) error {
	var old v1alpha1.ModelRouteStatus
	if st, ok := e.obj.Object["status"].(map[string]any); ok {
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(st, &old)
	}
	gen := e.obj.GetGeneration()
	st := v1alpha1.ModelRouteStatus{ObservedGeneration: gen, Conditions: slices.Clone(old.Conditions)}
	set := func(t string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: gen})
	}
	switch {
	case e.invalid != nil:
		set(v1alpha1.ConditionAccepted, false, "Invalid", e.invalid.Error())
		set(v1alpha1.ConditionProgrammed, false, "Invalid", "an invalid route stays out of the route file")
	case e.excess:
		set(v1alpha1.ConditionAccepted, true, "Valid", "the route is valid")
		set(v1alpha1.ConditionProgrammed, false, "TooManyRoutes", fmt.Sprintf(
			"position %d: a route file holds %d routes; raise the priority of routes that must be in it", e.position, routes.MaxRoutes))
	case !programmed:
		set(v1alpha1.ConditionAccepted, true, "Valid", "the route is valid")
		set(v1alpha1.ConditionProgrammed, false, why.reason, why.message)
	default:
		set(v1alpha1.ConditionAccepted, true, "Valid", "the route is valid")
		set(v1alpha1.ConditionProgrammed, true, "Written", fmt.Sprintf("key %s of ConfigMap %s, position %d", c.cfg.Key, c.cfg.ConfigMap, e.position))
		pos := int32(e.position)
		st.ConfigMap, st.Position = c.cfg.ConfigMap, &pos
	}
	if reflect.DeepEqual(st, old) {
		return nil
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return err
	}
	u := e.obj.DeepCopy()
	u.Object["status"] = m
	_, err = c.dyn.Resource(v1alpha1.ModelRoutesResource).Namespace(u.GetNamespace()).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if apierrors.IsNotFound(err) {
		return nil // deleted meanwhile: the next reconcile drops it from the file
	}
	return err
}
