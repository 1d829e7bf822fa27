package scheduler

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"
)

// PolicyFactory builds the policy registered as name from its parameter
// block: params is the block as the config gives it, or nil when the
// config has none (the plugin's published defaults). The factory owns the
// block's format: it decodes it strictly onto its defaults and validates
// it (ParseParams does both), listing every problem joined, each wrapping
// ErrConfig. It is called once per Validate and per New, also for a block
// whose policy is not selected (to report its problems), so it must be
// cheap and hold no resources until the policy is used (a policy that does
// implements Closer and is closed when discarded).
type PolicyFactory func(name string, params *yaml.Node) (Policy, error)

// FilterFactory builds filters from the block registered as name, like a
// PolicyFactory. Every registered filter factory runs for every Scheduler,
// in registration order; the chain is their results in that order.
type FilterFactory func(name string, params *yaml.Node) ([]Filter, error)

// Plugins is a set of named plugins: the policies and filter blocks a
// SchedulerConfig can name and the scorers a weighted policy can use. It
// turns a Config into a Scheduler. The framework never names a plugin:
// kvmesh registers its own in one place, scheduler/registry. A Plugins is
// built once, before use, and then only read (safe for concurrent use).
type Plugins struct {
	defaultPolicy string
	policies      []named[PolicyFactory]
	filters       []named[FilterFactory]
	scorers       []named[Scorer]
}

type named[T any] struct {
	name string
	v    T
}

func find[T any](s []named[T], name string) (T, bool) {
	for _, e := range s {
		if e.name == name {
			return e.v, true
		}
	}
	var zero T
	return zero, false
}

func names[T any](s []named[T]) []string {
	out := make([]string, len(s))
	for i, e := range s {
		out[i] = e.name
	}
	return out
}

// frameworkKeys are the Config fields a block may not be registered as.
var frameworkKeys = []string{"apiVersion", "kind", "policy", "seed", "tierWeights"}

// block panics when name cannot be a new block key: registering is done
// once at start-up from code, so a clash is a programming error.
func (p *Plugins) block(name string) {
	_, pol := find(p.policies, name)
	_, fil := find(p.filters, name)
	if name == "" || pol || fil || slices.Contains(frameworkKeys, name) {
		panic(fmt.Sprintf("scheduler: plugin block %q registered twice or reserved", name))
	}
}

// RegisterPolicy registers a policy factory under name, which is also the
// key of its parameter block. The first policy registered is the default
// until SetDefaultPolicy.
func (p *Plugins) RegisterPolicy(name string, f PolicyFactory) {
	p.block(name)
	p.policies = append(p.policies, named[PolicyFactory]{name, f})
	if p.defaultPolicy == "" {
		p.defaultPolicy = name
	}
}

// RegisterFilters registers a filter factory under name, the key of its
// parameter block.
func (p *Plugins) RegisterFilters(name string, f FilterFactory) {
	p.block(name)
	p.filters = append(p.filters, named[FilterFactory]{name, f})
}

// RegisterScorer registers a scorer a weighted policy can name.
func (p *Plugins) RegisterScorer(name string, s Scorer) {
	if _, dup := find(p.scorers, name); dup || name == "" {
		panic(fmt.Sprintf("scheduler: scorer %q registered twice", name))
	}
	p.scorers = append(p.scorers, named[Scorer]{name, s})
}

// SetDefaultPolicy names the policy a Config with Policy "" uses.
func (p *Plugins) SetDefaultPolicy(name string) { p.defaultPolicy = name }

// DefaultPolicy is the policy a Config with Policy "" uses.
func (p *Plugins) DefaultPolicy() string { return p.defaultPolicy }

// PolicyNames lists the registered policies in registration order.
func (p *Plugins) PolicyNames() []string { return names(p.policies) }

// ScorerNames lists the registered scorers in registration order.
func (p *Plugins) ScorerNames() []string { return names(p.scorers) }

// Scorer returns the scorer registered as name.
func (p *Plugins) Scorer(name string) (Scorer, bool) { return find(p.scorers, name) }

// DefaultConfig is the configuration used when no file is given.
func (p *Plugins) DefaultConfig() Config {
	c := DefaultConfig()
	c.Policy = p.defaultPolicy
	return c
}

// Validate lists every problem with c: the framework's fields, the policy
// name, and every block (an unknown key, and each plugin's decoding and
// validation problems), decoding problems first. c is not defaulted.
func (p *Plugins) Validate(c *Config) error {
	b := p.build(c, nil)
	b.close()
	return b.err()
}

// Policy builds the policy c names, with its parameters.
func (p *Plugins) Policy(c *Config) (Policy, error) {
	b := p.build(c, nil)
	if err := b.err(); err != nil {
		b.close()
		return nil, err
	}
	return b.policy, nil
}

// New validates c (after defaults) and builds a Scheduler over idx (nil
// for no prefix information).
func (p *Plugins) New(c Config, idx PrefixIndex, log *slog.Logger) (*Scheduler, error) {
	c.Defaults()
	b := p.build(&c, nil)
	if err := b.err(); err != nil {
		b.close()
		return nil, err
	}
	return New(b.filters, b.policy, idx, Options{TierWeights: c.Weights(), Seed: c.Seed, Logger: log})
}

// built is what build made of a Config, and every problem found.
type built struct {
	policy  Policy
	filters []Filter
	decode  []error // *DecodeError: sorted by line
	invalid []error // validation problems, in a stable order
}

func (b *built) err() error {
	slices.SortStableFunc(b.decode, func(x, y error) int { return cmp.Compare(lineOf(x), lineOf(y)) })
	return joinErrs(uniqueErrors(append(b.decode, b.invalid...)))
}

func (b *built) close() {
	if c, ok := b.policy.(Closer); ok {
		_ = c.Close()
	}
}

// lineOf orders decoding problems: by line, those without one last.
func lineOf(err error) int {
	var d *DecodeError
	if errors.As(err, &d) && d.Line > 0 {
		return d.Line
	}
	return int(^uint(0) >> 1)
}

// add sorts a factory's problems into decoding and validation ones.
func (b *built) add(err error) {
	for _, e := range flatten(err, nil) {
		var d *DecodeError
		if errors.As(e, &d) {
			b.decode = append(b.decode, e)
		} else {
			b.invalid = append(b.invalid, e)
		}
	}
}

// build runs every factory c needs: each filter factory, the selected
// policy's, and the factory of every block c gives (to report its
// problems). keyLines gives the file line of each top-level key when c
// was parsed from a file.
func (p *Plugins) build(c *Config, keyLines map[string]int) *built {
	b := &built{}
	policy := cmp.Or(c.Policy, p.defaultPolicy)
	for _, k := range slices.Sorted(maps.Keys(c.Params)) {
		_, pol := find(p.policies, k)
		_, fil := find(p.filters, k)
		if !pol && !fil {
			n := c.Params[k]
			line := cmp.Or(keyLines[k], n.Line)
			b.decode = append(b.decode, &DecodeError{Line: line, Msg: fmt.Sprintf("field %s not found in type %s", k, reflect.TypeFor[Config]())})
		}
	}
	var probs Problems
	c.problems(&probs)
	if _, ok := find(p.policies, policy); !ok {
		probs.Addf("policy", "%q is unknown (one of %v)", policy, p.PolicyNames())
	}
	c.tierProblems(&probs)
	b.invalid = append(b.invalid, probs.Errs()...)
	for _, f := range p.filters {
		fs, err := f.v(f.name, c.params(f.name))
		b.add(err)
		b.filters = append(b.filters, fs...)
	}
	for _, f := range p.policies {
		params := c.params(f.name)
		if params == nil && f.name != policy {
			continue
		}
		pol, err := f.v(f.name, params)
		b.add(err)
		if f.name == policy {
			b.policy = pol
		} else if cl, ok := pol.(Closer); ok {
			_ = cl.Close()
		}
	}
	return b
}

// ParseConfig decodes a SchedulerConfig strictly (unknown fields, a second
// YAML document and a missing apiVersion or kind are errors), applies
// defaults and validates it with the plugins. Every problem is listed,
// each once, wrapping ErrConfig: decoding problems first, in file order,
// then validation problems.
func (p *Plugins) ParseConfig(data []byte) (Config, error) {
	doc, extra, err := readDocument(data)
	if err != nil { // a syntax error leaves nothing to validate
		return Config{}, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	var c Config
	var decode []error
	if doc != nil {
		unknownFields(doc, reflect.TypeFor[Config](), &decode)
		if err := doc.Decode(&c); err != nil {
			decode = append(decode, decodeErrors(err)...)
		}
	}
	// A file must say what it is: only the other fields are defaulted.
	apiVersion, kind := c.APIVersion, c.Kind
	c.Defaults()
	c.APIVersion, c.Kind = apiVersion, kind
	c.Policy = cmp.Or(c.Policy, p.defaultPolicy)
	b := p.build(&c, keyLines(doc))
	b.close()
	b.decode = append(append(b.decode, decode...), extra...)
	if err := b.err(); err != nil {
		return Config{}, err
	}
	return c, nil
}

// LoadConfig reads and parses a SchedulerConfig file.
func (p *Plugins) LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read scheduler config: %w", err)
	}
	return p.ParseConfig(b)
}

// readDocument parses the first YAML document of data (nil when there is
// none) and checks that no second one follows; a second document is a
// problem in extra, a syntax error in the first is err.
func readDocument(data []byte) (doc *yaml.Node, extra []error, err error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	var first yaml.Node
	switch err := dec.Decode(&first); {
	case errors.Is(err, io.EOF):
		return nil, nil, nil
	case err != nil:
		return nil, nil, err
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		extra = append(extra, fmt.Errorf("%w: second YAML document: %w (one SchedulerConfig per file)", ErrConfig, err))
	case !isNull(&next):
		extra = append(extra, &DecodeError{Line: next.Line, Msg: "a second YAML document is not allowed (one SchedulerConfig per file)"})
	}
	if isNull(&first) {
		return nil, extra, nil
	}
	return &first, extra, nil
}

// keyLines maps each top-level key of doc to its line.
func keyLines(doc *yaml.Node) map[string]int {
	if doc == nil || len(doc.Content) == 0 || doc.Content[0].Kind != yaml.MappingNode {
		return nil
	}
	m := doc.Content[0]
	out := make(map[string]int, len(m.Content)/2)
	for i := 0; i+1 < len(m.Content); i += 2 {
		out[m.Content[i].Value] = m.Content[i].Line
	}
	return out
}

// flatten lists the leaves of errors joined with errors.Join (an error
// whose message is exactly its children's, one per line), keeping order.
func flatten(err error, out []error) []error {
	if err == nil {
		return out
	}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		kids := j.Unwrap()
		msgs := make([]string, len(kids))
		for i, k := range kids {
			msgs[i] = k.Error()
		}
		if strings.Join(msgs, "\n") == err.Error() {
			for _, k := range kids {
				out = flatten(k, out)
			}
			return out
		}
	}
	return append(out, err)
}

// uniqueErrors drops errors whose message an earlier one already has,
// keeping the order.
func uniqueErrors(errs []error) []error {
	seen := make(map[string]bool, len(errs))
	out := errs[:0:0]
	for _, e := range errs {
		if msg := e.Error(); !seen[msg] {
			seen[msg] = true
			out = append(out, e)
		}
	}
	return out
}

// joinErrs is errors.Join, nil for none.
func joinErrs(errs []error) error {
	if len(errs) == 0 {
		return nil
	}
	return errors.Join(errs...)
}

// Validator is a plugin's config block: Validate lists every problem,
// with paths under the block's name (Problems).
type Validator interface {
	Validate(name string) error
}

// ParseParams decodes the block registered as name onto def (the
// plugin's defaults) with DecodeParams and validates the result, listing
// the problems of both: a block with an unknown field still has its other
// fields checked.
func ParseParams[C Validator](name string, params *yaml.Node, def C) (C, error) {
	err := DecodeParams(params, &def)
	return def, errors.Join(err, def.Validate(name))
}

// NoParams is the factory of a policy without parameters: a block for it
// is an error.
func NoParams(newPolicy func() Policy) PolicyFactory {
	return func(name string, params *yaml.Node) (Policy, error) {
		if params != nil {
			return nil, &DecodeError{Line: params.Line, Msg: fmt.Sprintf("policy %s takes no parameters", name)}
		}
		return newPolicy(), nil
	}
}
