package main

import (
	"flag"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/internal/logutil"
	"github.com/kvmesh/kvmesh/internal/secretflag"
)

// flagProblems collects bad flag values instead of stopping at the first,
// so a command reports every problem at once, on one line (exit 2).
type flagProblems struct {
	probs   []string
	pending map[string]error // problems of a flag's default, dropped when the flag is given
	// overrides are the flags given over a bad default from the
	// environment: refuseOff takes them, whether or not their feature is on.
	overrides map[string]bool
}

// given records that flag name was given: it replaces its default, and a
// problem with that default no longer counts.
func (p *flagProblems) given(name string) {
	if _, ok := p.pending[name]; ok {
		if p.overrides == nil {
			p.overrides = map[string]bool{}
		}
		p.overrides[name] = true
		delete(p.pending, name)
	}
}

// unlessGiven records a problem with the default of flag name (from the
// environment, say) that counts only if the flag is not given.
func (p *flagProblems) unlessGiven(name string, err error) {
	if p.pending == nil {
		p.pending = map[string]error{}
	}
	p.pending[name] = err
}

func (p *flagProblems) add(format string, a ...any) {
	p.probs = append(p.probs, fmt.Sprintf(format, a...))
}

// addErr adds a validation error, one problem per line of it.
func (p *flagProblems) addErr(err error) {
	if err != nil {
		p.probs = append(p.probs, strings.Split(err.Error(), "\n")...)
	}
}

// err is the usage error listing every problem, nil when there is none.
func (p *flagProblems) err() error {
	for _, name := range slices.Sorted(maps.Keys(p.pending)) { // the same order on every run
		p.add("%v (from the environment)", p.pending[name])
	}
	p.pending = nil
	if len(p.probs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %s", errUsage, strings.Join(p.probs, "; "))
}

// funcValue is a flag whose value set parses; its help shows def.
type funcValue struct {
	def string
	set func(string) error
}

func (f *funcValue) String() string {
	if f == nil {
		return ""
	}
	return f.def
}

func (f *funcValue) Set(s string) error { return f.set(s) }

// Var binds a flag whose value set parses. A value it rejects is recorded
// as a problem (formatted by its error) and parsing goes on.
func (p *flagProblems) Var(fs *flag.FlagSet, name, def, usage string, set func(string) error) {
	fs.Var(&funcValue{def: def, set: func(s string) error {
		p.given(name)
		if err := set(s); err != nil {
			p.add("%v", err)
		}
		return nil
	}}, name, usage)
}

// LogLevel binds --log-level onto dst.
func (p *flagProblems) LogLevel(fs *flag.FlagSet, dst *slog.Level) {
	p.Var(fs, "log-level", strings.ToLower(dst.String()), "debug, info, warn or error", func(s string) error {
		if err := dst.UnmarshalText([]byte(s)); err != nil {
			return fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
		}
		return nil
	})
}

// LogFormat binds --log-format onto dst.
func (p *flagProblems) LogFormat(fs *flag.FlagSet, dst *string) {
	p.Var(fs, "log-format", *dst, "log format on stderr: json or text", func(s string) error {
		if err := logutil.CheckFormat(s); err != nil {
			return fmt.Errorf("--%w", err)
		}
		*dst = s
		return nil
	})
}

// NonNegative binds an int64 flag that must be ≥ 0.
func (p *flagProblems) NonNegative(fs *flag.FlagSet, dst *int64, name, usage string) {
	p.Var(fs, name, fmt.Sprint(*dst), usage, func(s string) error {
		// The whole string, base 10: fmt.Sscan read "100k" as 100 and
		// "0x10" as 16. No SI suffixes: the config files and the docs
		// write these limits as plain numbers (200000).
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("--%s %q: want a whole number (100000, not 100k)", name, s)
		}
		if v < 0 {
			return fmt.Errorf("--%s must be >= 0, got %d", name, v)
		}
		*dst = v
		return nil
	})
}

// secretEnvFlag binds a string flag holding a secret onto dst, its default
// $env when that is set: -h and the usage dump after a parse error say
// "(env ENV; set)", never the value (internal/secretflag).
func secretEnvFlag(fs *flag.FlagSet, dst *string, name, env, usage string) {
	secretflag.Var(fs, dst, name, env, usage)
}

// List binds a comma-separated list flag onto dst (empty items dropped).
// The flag's first use replaces dst (a default, or a config file's list);
// a repeat adds to it, as --engine does: "--join a --join b" is both seeds,
// not the last alone.
func List(fs *flag.FlagSet, dst *[]string, name, usage string) {
	given := false
	fs.Var(&funcValue{def: strings.Join(*dst, ","), set: func(s string) error {
		if !given {
			*dst, given = nil, true
		}
		*dst = append(*dst, commaList(s)...)
		return nil
	}}, name, usage)
}

// ModelPaths binds a repeatable key=value flag onto dst (form says which,
// "model=path"); given at all, the flags replace the map (a config file's
// entries included).
func (p *flagProblems) ModelPaths(fs *flag.FlagSet, dst *map[string]string, name, form, usage string) {
	fresh := true
	p.Var(fs, name, "", usage, func(s string) error {
		model, path, ok := strings.Cut(s, "=")
		if !ok || model == "" || path == "" {
			return fmt.Errorf("--%s %q: want %s", name, s, form)
		}
		if fresh || *dst == nil {
			*dst, fresh = map[string]string{}, false
		}
		(*dst)[model] = path
		return nil
	})
}

// multiFlag collects a repeated string flag.
type multiFlag []string

func (m *multiFlag) String() string     { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error { *m = append(*m, v); return nil }

func commaList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// offFlag is a flag read only while a feature is on: off says the final
// configuration (flags over any config file) leaves it off, why what the
// flag lacks ("without --admin").
type offFlag struct {
	name string
	off  bool
	why  string
}

// refuseOff adds a problem for every flag given in fs whose feature is off
// (each flag once; the first of its rules that is off says why), but one
// given to replace a bad default from the environment. A flag's default
// from the environment is not read either while its feature is off: a
// problem with it is dropped (a stray $KVMESH_GOSSIP_KEY does not stop an
// ingress without gossip).
func (p *flagProblems) refuseOff(fs *flag.FlagSet, rules []offFlag) {
	for _, r := range rules {
		if r.off {
			delete(p.pending, r.name)
		}
	}
	fs.Visit(func(f *flag.Flag) {
		if p.overrides[f.Name] {
			return
		}
		for _, r := range rules {
			if r.name == f.Name && r.off {
				p.add("--%s is not read %s", f.Name, r.why)
				return
			}
		}
	})
}

// refuseUnread is a usage error naming every flag given that a run of the
// kind run does not read (read reports whether it does), or nil: a flag
// silently ignored makes a run look like what it is not.
func refuseUnread(fs *flag.FlagSet, run string, read func(name string) bool) error {
	var probs []string
	fs.Visit(func(f *flag.Flag) {
		if !read(f.Name) {
			probs = append(probs, fmt.Sprintf("--%s is not read by a %s run", f.Name, run))
		}
	})
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(probs, "; "))
	}
	return nil
}
