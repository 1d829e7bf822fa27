package scheduler

import (
	"fmt"
	"math"
	"strings"
)

// Problems collects configuration problems under a path prefix (a plugin's
// block name, e.g. "kvmesh"), each wrapping ErrConfig and reading
// "prefix.field: what is wrong". Plugins use it in their Validate so every
// block reports problems the same way; the zero value has no prefix.
type Problems struct {
	prefix string
	errs   []error
}

// NewProblems returns an empty list whose paths start with prefix.
func NewProblems(prefix string) *Problems { return &Problems{prefix: prefix} }

// path joins the prefix and a field ("" names the block itself, "[2].name"
// an element of it).
func (p *Problems) path(field string) string {
	switch {
	case p.prefix == "":
		return field
	case field == "":
		return p.prefix
	case strings.HasPrefix(field, "["):
		return p.prefix + field
	}
	return p.prefix + "." + field
}

// Addf records a problem with field.
func (p *Problems) Addf(field, format string, a ...any) {
	p.errs = append(p.errs, fmt.Errorf("%w: %s: %s", ErrConfig, p.path(field), fmt.Sprintf(format, a...)))
}

// Len is the number of problems so far.
func (p *Problems) Len() int { return len(p.errs) }

// Errs returns the problems in the order they were found.
func (p *Problems) Errs() []error { return p.errs }

// Finite reports a NaN or infinite v and says whether v is finite; the
// range checks below run only on finite values, so a NaN is reported as
// such and not also as out of range.
func (p *Problems) Finite(field string, v float64) bool {
	switch {
	case math.IsNaN(v):
		p.Addf(field, "NaN is not a number")
	case math.IsInf(v, 0):
		p.Addf(field, "%v is not a finite number", v)
	default:
		return true
	}
	return false
}

// NonNegative checks that v is finite and ≥ 0.
func (p *Problems) NonNegative(field string, v float64) {
	if p.Finite(field, v) && v < 0 {
		p.Addf(field, "%v is negative", v)
	}
}

// Positive checks that v is finite and > 0.
func (p *Problems) Positive(field string, v float64) {
	if p.Finite(field, v) && v <= 0 {
		p.Addf(field, "%v must be > 0", v)
	}
}

// Within checks that v is finite and in [lo, hi].
func (p *Problems) Within(field string, v, lo, hi float64) {
	if p.Finite(field, v) && (v < lo || v > hi) {
		p.Addf(field, "%v is outside [%v,%v]", v, lo, hi)
	}
}

// AtLeast checks that v is finite and ≥ lo.
func (p *Problems) AtLeast(field string, v, lo float64) {
	if p.Finite(field, v) && v < lo {
		p.Addf(field, "%v must be ≥ %v", v, lo)
	}
}

// NonNegativeInt checks that n ≥ 0.
func (p *Problems) NonNegativeInt(field string, n int) {
	if n < 0 {
		p.Addf(field, "%d is negative", n)
	}
}
