package local

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"strings"

	"sigs.k8s.io/yaml"

	"github.com/kvmesh/kvmesh/orchestrator"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
	"github.com/kvmesh/kvmesh/orchestrator/modelroutes"
)

// Annotations the local backend reads; the Kubernetes controller ignores them.
const (
	// AnnotationSimArgs on a role's pod template (or on the ModelDeployment,
	// for every role) adds `kvmesh sim` flags, space-separated, e.g.
	// "--profile 7b-h100 --time-scale 4 --gpu-blocks 2048".
	AnnotationSimArgs = "kvmesh.io/local-sim-args"
	// AnnotationIngress "true" on a ModelDeployment asks for an ingress in
	// front of its engines (as --ingress does).
	AnnotationIngress = "kvmesh.io/local-ingress"
)

// Spec is what one file describes.
type Spec struct {
	Deployments []v1alpha1.ModelDeployment
	Policies    []v1alpha1.AutoscalingPolicy
	Routes      []v1alpha1.ModelRoute
	// RouteFile is the ingress's route file rendered from Routes (an empty
	// route list without any).
	RouteFile string
}

// ErrSpec wraps every problem found in a file.
var ErrSpec = errors.New("invalid local spec")

// maxSpecBytes bounds what ParseSpec reads: a spec is a few kilobytes.
const maxSpecBytes = 4 << 20

// LoadSpec reads and parses a multi-document YAML file.
func LoadSpec(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read spec: %w", err)
	}
	return ParseSpec(b)
}

var docSep = regexp.MustCompile(`(?m)^---[ \t]*$`)

// ParseSpec decodes ModelDeployment and AutoscalingPolicy documents
// (apiVersion kvmesh.io/v1alpha1), applies the defaults and lists every
// problem: unknown kinds, missing names, duplicate names, roles without a
// kind, policies whose target or roles do not exist.
func ParseSpec(b []byte) (*Spec, error) {
	if len(b) > maxSpecBytes {
		return nil, fmt.Errorf("%w: %d bytes (limit %d)", ErrSpec, len(b), maxSpecBytes)
	}
	s := &Spec{}
	var errs []error
	add := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrSpec}, a...)...))
	}
	for i, doc := range docSep.Split(string(b), -1) {
		if strings.TrimSpace(stripComments(doc)) == "" {
			continue
		}
		var head struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			add("document %d: %v", i+1, err)
			continue
		}
		if head.APIVersion != v1alpha1.SchemeGroupVersion.String() {
			add("document %d: apiVersion %q, want %s", i+1, head.APIVersion, v1alpha1.SchemeGroupVersion)
			continue
		}
		switch head.Kind {
		case "ModelDeployment":
			var md v1alpha1.ModelDeployment
			if err := yaml.UnmarshalStrict([]byte(doc), &md); err != nil {
				add("document %d: %v", i+1, err)
				continue
			}
			errs = append(errs, gangProblems(&md)...) // before Defaults, which caps gangMinimum at replicas
			md.Defaults()
			s.Deployments = append(s.Deployments, md)
		case "AutoscalingPolicy":
			var ap v1alpha1.AutoscalingPolicy
			if err := yaml.UnmarshalStrict([]byte(doc), &ap); err != nil {
				add("document %d: %v", i+1, err)
				continue
			}
			s.Policies = append(s.Policies, ap)
		case "ModelRoute":
			var mr v1alpha1.ModelRoute
			if err := yaml.UnmarshalStrict([]byte(doc), &mr); err != nil {
				add("document %d: %v", i+1, err)
				continue
			}
			s.Routes = append(s.Routes, mr)
		default:
			add("document %d: kind %q, want ModelDeployment, AutoscalingPolicy or ModelRoute", i+1, head.Kind)
		}
	}
	errs = append(errs, s.validate(len(errs) > 0)...)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return s, nil
}

func stripComments(doc string) string {
	var out bytes.Buffer
	for _, l := range strings.Split(doc, "\n") {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "#") {
			out.WriteString(l)
			out.WriteByte('\n')
		}
	}
	return out.String()
}

var nameRE = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// gangProblems: the schema's "gangMinimum must not exceed replicas" (an
// absent replicas is the default 1).
func gangProblems(md *v1alpha1.ModelDeployment) []error {
	var errs []error
	for _, r := range md.Spec.Roles {
		if r.GangMinimum == nil {
			continue
		}
		n := int32(1)
		if r.Replicas != nil {
			n = *r.Replicas
		}
		if g := *r.GangMinimum; g < 0 || g > n {
			errs = append(errs, fmt.Errorf("%w: ModelDeployment %q role %q: gangMinimum %d not in [0, replicas %d]", ErrSpec, md.Name, r.Name, g, n))
		}
	}
	return errs
}

// metricNames are the schema's metric names (AutoscalingPolicy
// spec.roles[].metrics[].name).
var metricNames = []string{autoscale.WaitingRequests, autoscale.RunningRequests, autoscale.KVUsage,
	autoscale.PrefillQueueTokens, autoscale.TTFTP90, autoscale.TPOTP90}

// validate checks what the CRD schemas check and what the local backend
// needs, naming the field of each problem. docErrs: some document did not
// decode, so a missing ModelDeployment may be that document (not reported).
func (s *Spec) validate(docErrs bool) []error {
	var errs []error
	add := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrSpec}, a...)...))
	}
	if len(s.Deployments) == 0 && !docErrs {
		add("no ModelDeployment")
	}
	mds := map[string]*v1alpha1.ModelDeployment{}
	for i := range s.Deployments {
		md := &s.Deployments[i]
		if !nameRE.MatchString(md.Name) {
			add("ModelDeployment name %q: want a DNS label", md.Name)
		}
		if mds[md.Name] != nil {
			add("ModelDeployment %q twice", md.Name)
		}
		mds[md.Name] = md
		if md.Spec.Model == "" {
			add("ModelDeployment %q: no model", md.Name)
		}
		if g := *md.Spec.Groups; g != 1 {
			add("ModelDeployment %q: groups %d; the local backend runs one group", md.Name, g)
		}
		switch md.Spec.Engine {
		case v1alpha1.EngineVLLM, v1alpha1.EngineSGLang:
		default:
			add("ModelDeployment %q: engine %q, want vllm or sglang", md.Name, md.Spec.Engine)
		}
		switch md.Spec.RecoveryPolicy {
		case v1alpha1.RecoverGroup, v1alpha1.RecoverRole, v1alpha1.RecoverNone:
		default:
			add("ModelDeployment %q: recoveryPolicy %q, want GroupRecreate, RoleRecreate or None", md.Name, md.Spec.RecoveryPolicy)
		}
		roles := map[string]bool{}
		for _, r := range md.Spec.Roles {
			if !nameRE.MatchString(r.Name) || roles[r.Name] {
				add("ModelDeployment %q: role name %q missing, invalid or repeated", md.Name, r.Name)
			}
			roles[r.Name] = true
			switch r.Kind {
			case v1alpha1.RolePrefill, v1alpha1.RoleDecode, v1alpha1.RoleMixed:
			default:
				add("ModelDeployment %q role %q: kind %q, want prefill, decode or mixed", md.Name, r.Name, r.Kind)
			}
			if *r.Replicas < 0 || *r.Replicas > maxReplicas {
				add("ModelDeployment %q role %q: replicas %d not in [0, %d]", md.Name, r.Name, *r.Replicas, maxReplicas)
			}
		}
		if len(md.Spec.Roles) == 0 {
			add("ModelDeployment %q: no roles", md.Name)
		}
	}
	targets := map[string]bool{}
	for _, ap := range s.Policies {
		md := mds[ap.Spec.Target]
		if md == nil {
			add("AutoscalingPolicy %q: target ModelDeployment %q not in the file", ap.Name, ap.Spec.Target)
			continue
		}
		if targets[md.Name] {
			add("AutoscalingPolicy %q: ModelDeployment %q already has a policy", ap.Name, md.Name)
		}
		targets[md.Name] = true
		before := len(errs)
		errs = append(errs, policyProblems(&ap, md)...)
		if sl := ap.Spec.SLO; sl != nil && sl.AggregateBelow > 0 && md.Spec.Engine == v1alpha1.EngineSGLang {
			// As the controller refuses it: an SGLang decode server takes a
			// request only with a prefill server's bootstrap.
			add("AutoscalingPolicy %q: slo.aggregateBelow %v on ModelDeployment %q, which runs sglang, whose decode servers "+
				"cannot serve whole requests, so the prefill role cannot go to zero; remove aggregateBelow", ap.Name, sl.AggregateBelow, md.Name)
		}
		if len(errs) == before { // what autoscale refuses beyond the above (named there already)
			p := policyFromSpec(&ap.Spec)
			if err := p.Validate(); err != nil {
				add("AutoscalingPolicy %q: %v", ap.Name, err)
			}
		}
		// No Prometheus here: a role at zero comes back only through a ratio band.
		if stuck := orchestrator.RolesStuckAtZero(&ap.Spec, false); len(stuck) > 0 {
			add("AutoscalingPolicy %q role %s: minReplicas 0, and nothing would bring it back from zero (no engine, no load "+
				"observed); set minReplicas to 1 or more, or put it in a ratio band with a role whose minReplicas is 1 or more",
				ap.Name, strings.Join(stuck, ", "))
		}
	}
	names := map[string]bool{}
	for _, r := range s.Routes {
		if !nameRE.MatchString(r.Name) {
			add("ModelRoute name %q: want a DNS label", r.Name)
		}
		if names[r.Name] {
			add("ModelRoute %q twice", r.Name)
		}
		names[r.Name] = true
	}
	// The same rules and order as the Kubernetes controller; here an
	// invalid route fails the file, as any bad configuration does.
	file, err := modelroutes.File("the local spec", s.Routes)
	if err != nil {
		add("%v", err)
	}
	s.RouteFile = file
	return errs
}

// policyProblems checks a policy's fields as the schema does (and the
// local replica limit), each problem naming its field.
func policyProblems(ap *v1alpha1.AutoscalingPolicy, md *v1alpha1.ModelDeployment) []error {
	var errs []error
	add := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: AutoscalingPolicy %q"+format, append([]any{ErrSpec, ap.Name}, a...)...))
	}
	sp := &ap.Spec
	if len(sp.Roles) == 0 {
		add(": no roles")
	}
	roles := map[string]bool{}
	for _, r := range sp.Roles {
		if roles[r.Name] {
			add(": role %q twice", r.Name)
		}
		roles[r.Name] = true
		if roleOf(md, r.Name) == nil {
			add(": role %q not in ModelDeployment %q", r.Name, md.Name)
		}
		switch {
		case r.MinReplicas < 0:
			add(" role %q: minReplicas %d below 0", r.Name, r.MinReplicas)
		case r.MinReplicas > r.MaxReplicas:
			add(" role %q: minReplicas %d above maxReplicas %d", r.Name, r.MinReplicas, r.MaxReplicas)
		}
		switch {
		case r.MaxReplicas < 1:
			add(" role %q: maxReplicas %d below 1", r.Name, r.MaxReplicas)
		case r.MaxReplicas > maxReplicas:
			add(" role %q: maxReplicas %d above the local limit %d", r.Name, r.MaxReplicas, maxReplicas)
		}
		for _, m := range r.Metrics {
			switch {
			case !slices.Contains(metricNames, m.Name):
				add(" role %q: metric name %q, want one of %s", r.Name, m.Name, strings.Join(metricNames, ", "))
			case m.Name == autoscale.TTFTP90 || m.Name == autoscale.TPOTP90:
				// The schema takes them (the controller reads the ingresses'
				// gossiped latency summaries per role); the local backend
				// measures none per role, so the role would hold forever.
				add(" role %q: metric %q is not measured by the local backend (no per-role latency percentile; use the slo block, or %s)",
					r.Name, m.Name, strings.Join(metricNames[:4], ", "))
			}
			if !(m.Target > 0) || math.IsInf(m.Target, 1) { // NaN fails > 0
				add(" role %q metric %q: target %v, want a number above 0", r.Name, m.Name, m.Target)
			}
			switch m.Source {
			case "", "mesh":
			case "prometheus":
				add(" role %q metric %q: source prometheus is not read by the local backend (the mesh's own load is: leave source unset)", r.Name, m.Name)
			default:
				add(" role %q metric %q: source %q, want mesh or prometheus", r.Name, m.Name, m.Source)
			}
		}
	}
	i32 := func(field string, v *int32, lo, hi int32) {
		if v != nil && (*v < lo || *v > hi) {
			add(": %s %d not in [%d, %d]", field, *v, lo, hi)
		}
	}
	i32("tolerancePercent", sp.TolerancePercent, 0, 100)
	i32("stableWindowSeconds", sp.StableWindowSeconds, 1, math.MaxInt32)
	i32("panicWindowSeconds", sp.PanicWindowSeconds, 1, math.MaxInt32)
	i32("panicThresholdPercent", sp.PanicThresholdPercent, 101, math.MaxInt32)
	i32("scaleDownCooldownSeconds", sp.ScaleDownCooldownSeconds, 0, math.MaxInt32)
	stable, panicW := int32(180), int32(60)
	if sp.StableWindowSeconds != nil {
		stable = *sp.StableWindowSeconds
	}
	if sp.PanicWindowSeconds != nil {
		panicW = *sp.PanicWindowSeconds
	}
	if stable < panicW {
		add(": stableWindowSeconds %d below panicWindowSeconds %d (defaults 180 and 60)", stable, panicW)
	}
	for _, f := range []struct {
		name string
		v    *float64
	}{{"maxScaleUpRate", sp.MaxScaleUpRate}, {"maxScaleDownRate", sp.MaxScaleDownRate}} {
		if f.v != nil && (!(*f.v >= 1) || math.IsInf(*f.v, 1)) {
			add(": %s %v, want a number of at least 1", f.name, *f.v)
		}
	}
	if rc := sp.Ratio; rc != nil {
		for _, f := range []struct{ field, role string }{{"numeratorRole", rc.NumeratorRole}, {"denominatorRole", rc.DenominatorRole}} {
			if !roles[f.role] {
				add(": ratio %s %q is not a role of the policy", f.field, f.role)
			}
		}
		if rc.NumeratorRole == rc.DenominatorRole {
			add(": ratio numeratorRole and denominatorRole are both %q; the ratio needs two roles", rc.NumeratorRole)
		}
		okMin, okMax := rc.MinRatio > 0 && !math.IsInf(rc.MinRatio, 1), rc.MaxRatio > 0 && !math.IsInf(rc.MaxRatio, 1)
		if !okMin {
			add(": ratio minRatio %v, want a number above 0", rc.MinRatio)
		}
		if !okMax {
			add(": ratio maxRatio %v, want a number above 0", rc.MaxRatio)
		}
		if okMin && okMax && rc.MinRatio > rc.MaxRatio {
			add(": ratio minRatio %v above maxRatio %v (inverted band)", rc.MinRatio, rc.MaxRatio)
		}
	}
	return errs
}

// maxReplicas bounds one role on one machine: each replica is two processes.
const maxReplicas = 32

func roleOf(md *v1alpha1.ModelDeployment, name string) *v1alpha1.Role {
	for i := range md.Spec.Roles {
		if md.Spec.Roles[i].Name == name {
			return &md.Spec.Roles[i]
		}
	}
	return nil
}

// policyFor returns the policy targeting md, or nil.
func (s *Spec) policyFor(md string) *v1alpha1.AutoscalingPolicy {
	for i := range s.Policies {
		if s.Policies[i].Spec.Target == md {
			return &s.Policies[i]
		}
	}
	return nil
}

// wantsIngress reports whether any deployment asks for an ingress.
func (s *Spec) wantsIngress() bool {
	for _, md := range s.Deployments {
		if md.Annotations[AnnotationIngress] == "true" {
			return true
		}
	}
	return false
}

// simArgs is the deployment's then the role's AnnotationSimArgs.
func simArgs(md *v1alpha1.ModelDeployment, r *v1alpha1.Role) []string {
	return append(strings.Fields(md.Annotations[AnnotationSimArgs]), strings.Fields(r.Template.Annotations[AnnotationSimArgs])...)
}
