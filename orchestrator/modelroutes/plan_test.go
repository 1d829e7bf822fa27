package modelroutes

import (
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/ingress/routes"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestFileOrderAndBounds: File orders by priority then name, leaves an
// invalid route out with its problem, and past routes.MaxRoutes keeps the
// highest priorities and names the routes left out, so too many routes
// never make the whole file invalid.
func TestFileOrderAndBounds(t *testing.T) {
	route := func(name string, prio int32, weight int32) v1alpha1.ModelRoute {
		return v1alpha1.ModelRoute{ObjectMeta: metav1.ObjectMeta{Name: name}, Spec: v1alpha1.ModelRouteSpec{Priority: prio,
			Match: v1alpha1.RouteMatch{Model: name}, Backends: []v1alpha1.RouteBackend{{Model: "m", Weight: &weight}}}}
	}
	rs := []v1alpha1.ModelRoute{route("b", 0, 1), route("a", 0, 1), route("top", 5, 1), route("zero", 9, 0)}
	data, err := File("test", rs)
	if err == nil || !strings.Contains(err.Error(), `ModelRoute "zero"`) {
		t.Fatalf("the all-zero-weight route not reported: %v", err)
	}
	c, perr := routes.Parse([]byte(data))
	if perr != nil || len(c.Routes) != 3 || c.Routes[0].Name != "top" || c.Routes[1].Name != "a" || c.Routes[2].Name != "b" {
		t.Fatalf("file %v:\n%s", perr, data)
	}

	rs = rs[:0]
	for i := range routes.MaxRoutes + 2 {
		rs = append(rs, route(fmt.Sprintf("r%04d", i), int32(i%3), 1))
	}
	data, err = File("test", rs)
	c, perr = routes.Parse([]byte(data))
	if perr != nil || len(c.Routes) != routes.MaxRoutes {
		t.Fatalf("%d routes in the file (%v), want %d", len(c.Routes), perr, routes.MaxRoutes)
	}
	// The two left out are the last by order: priority 0, the highest names.
	last := fmt.Sprintf("r%04d", (routes.MaxRoutes+1)/3*3)
	if err == nil || strings.Count(err.Error(), "past the") != 2 || !strings.Contains(err.Error(), last) {
		t.Errorf("routes left out: %v (want two, %s among them)", err, last)
	}
}
