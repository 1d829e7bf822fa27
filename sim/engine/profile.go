package engine

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// ErrProfileFile wraps every problem with a --profile-file.
var ErrProfileFile = errors.New("engine: bad profile file")

// Profile is a timing model: a model on a GPU, described by roofline numbers.
// A step's duration is
//
//	StepOverhead + PerSeqOverhead·seqs + max(FLOPs/FLOPS, bytes/MemBW) + loadBytes/HostBW
//
// with FLOPs = 2·Params·tokens + 4·Layers·Hidden·Σ q·(c + (q+1)/2) (linear layers
// plus causal attention of q new tokens over c cached ones), bytes = WeightBytes +
// KVBytesPerToken·Σ(c+q) (weights and the KV cache read once per step) and
// loadBytes the KV of prefix blocks brought back from the CPU tier. Prefill is
// compute-bound (grows with uncached tokens plus the attention term); decode is
// memory-bound (grows with total context) plus a per-sequence overhead (grows
// with batch size). docs/SIMULATOR.md derives each profile's numbers.
type Profile struct {
	Name            string
	Params          float64       // parameters (linear-layer FLOPs = 2·Params per token)
	WeightBytes     float64       // bytes of weights read per step
	Layers          int           // transformer layers
	Hidden          int           // model width (attention FLOPs per query·key pair = 4·Layers·Hidden)
	KVBytesPerToken float64       // bytes of K and V per token, all layers
	FLOPS           float64       // sustained FLOP/s (peak × achievable utilisation)
	MemBW           float64       // sustained HBM bytes/s
	HostBW          float64       // sustained host↔GPU bytes/s (CPU-tier loads)
	StepOverhead    time.Duration // scheduler + launch overhead per step
	PerSeqOverhead  time.Duration // sampling and bookkeeping per sequence per step

	// MaxNumSeqs and MaxNumBatchedTokens are vLLM's defaults for the GPU
	// (EngineArgs.get_batch_defaults, OpenAI server: 1024 sequences and 8192
	// tokens per step on GPUs with ≥ 70 GiB other than the A100, 256 and
	// 2048 on the rest). An engine whose Config leaves MaxRunning or
	// MaxBatchTokens zero uses them; zero here means the Config defaults.
	MaxNumSeqs          int
	MaxNumBatchedTokens int
}

var profiles = map[string]Profile{
	// Llama-2-7B (MHA, fp16) on one H100 SXM: 989 TFLOP/s dense bf16 at ~40%
	// MFU, 3.35 TB/s HBM3 at ~80%, PCIe Gen5 x16 at ~25 GB/s effective.
	"7b-h100": {
		Name: "7b-h100", Params: 6.74e9, WeightBytes: 13.5e9, Layers: 32, Hidden: 4096,
		KVBytesPerToken: 2 * 32 * 4096 * 2, FLOPS: 400e12, MemBW: 2.7e12, HostBW: 25e9,
		StepOverhead: 2 * time.Millisecond, PerSeqOverhead: 20 * time.Microsecond,
		MaxNumSeqs: 1024, MaxNumBatchedTokens: 8192,
	},
	// Llama-3-8B (GQA 8 KV heads × 128, bf16) on one H100 SXM.
	"8b-h100": {
		Name: "8b-h100", Params: 8.03e9, WeightBytes: 16.1e9, Layers: 32, Hidden: 4096,
		KVBytesPerToken: 2 * 32 * 8 * 128 * 2, FLOPS: 400e12, MemBW: 2.7e12, HostBW: 25e9,
		StepOverhead: 2 * time.Millisecond, PerSeqOverhead: 20 * time.Microsecond,
		MaxNumSeqs: 1024, MaxNumBatchedTokens: 8192,
	},
	// Qwen2.5-7B (GQA 4 KV heads × 128, 28 layers, bf16: 56 KiB of KV per
	// token) on one L40S, 48 GB: 362 TFLOP/s dense bf16 at ~40% MFU, 864 GB/s
	// GDDR6 at ~80%. 15.2 GB of weights leave ≈ 480k tokens of KV at vLLM's
	// 0.9 memory utilisation: the "7B model on a 48 GB GPU". vLLM's
	// batch defaults on a GPU under 70 GiB: 256 sequences, 2048 tokens.
	"7b-l40s": {
		Name: "7b-l40s", Params: 7.62e9, WeightBytes: 15.2e9, Layers: 28, Hidden: 3584,
		KVBytesPerToken: 2 * 28 * 4 * 128 * 2, FLOPS: 0.4 * 362e12, MemBW: 0.8 * 864e9, HostBW: 25e9,
		StepOverhead: 2 * time.Millisecond, PerSeqOverhead: 20 * time.Microsecond,
		MaxNumSeqs: 256, MaxNumBatchedTokens: 2048,
	},
	// Llama-3-70B (GQA, bf16) tensor-parallel over 4 H100 SXM: 4× the FLOP/s and
	// bandwidth at ~85% TP efficiency, plus all-reduce latency in the overhead.
	"70b-4xh100": {
		Name: "70b-4xh100", Params: 70.6e9, WeightBytes: 141e9, Layers: 80, Hidden: 8192,
		KVBytesPerToken: 2 * 80 * 8 * 128 * 2, FLOPS: 4 * 400e12 * 0.85, MemBW: 4 * 2.7e12 * 0.85, HostBW: 4 * 25e9,
		StepOverhead: 4 * time.Millisecond, PerSeqOverhead: 30 * time.Microsecond,
		MaxNumSeqs: 1024, MaxNumBatchedTokens: 8192, // vLLM's defaults on an H100
	},
	// Qwen2-0.5B-like model on an L4 (121 TFLOP/s bf16 at ~40%, 300 GB/s at ~80%).
	"0.5b-l4": {
		Name: "0.5b-l4", Params: 0.49e9, WeightBytes: 0.99e9, Layers: 24, Hidden: 896,
		KVBytesPerToken: 2 * 24 * 2 * 64 * 2, FLOPS: 48e12, MemBW: 240e9, HostBW: 12e9,
		StepOverhead: 1 * time.Millisecond, PerSeqOverhead: 10 * time.Microsecond,
		MaxNumSeqs: 256, MaxNumBatchedTokens: 2048,
	},
	// tiny is for tests: a made-up small model whose steps are a few
	// milliseconds, so proportions hold while tests stay fast.
	"tiny": {
		Name: "tiny", Params: 50e6, WeightBytes: 1e9, Layers: 4, Hidden: 512,
		KVBytesPerToken: 16384, FLOPS: 20e12, MemBW: 1e12, HostBW: 10e9,
		StepOverhead: 200 * time.Microsecond, PerSeqOverhead: 5 * time.Microsecond,
	},
}

// DefaultProfile is the profile used when none is named.
const DefaultProfile = "7b-h100"

// LookupProfile returns the named profile.
func LookupProfile(name string) (Profile, error) {
	p, ok := profiles[name]
	if !ok {
		return Profile{}, fmt.Errorf("%w: %q (known: %v)", ErrUnknownProfile, name, ProfileNames())
	}
	return p, nil
}

// ProfileNames lists the named profiles, sorted.
func ProfileNames() []string {
	names := make([]string, 0, len(profiles))
	for n := range profiles {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// validate lists what is wrong with p. Every float must be finite: a NaN
// passes any "<= 0" test, and a NaN or infinite rate makes every step's
// duration meaningless. Fields are named by their profile-file keys.
func (p *Profile) validate() []error {
	var errs []error
	for _, f := range []struct {
		key      string
		v        float64
		positive bool
	}{
		{"params", p.Params, true}, {"weightBytes", p.WeightBytes, false}, {"kvBytesPerToken", p.KVBytesPerToken, false},
		{"flops", p.FLOPS, true}, {"memBW", p.MemBW, true}, {"hostBW", p.HostBW, false},
	} {
		switch {
		case math.IsNaN(f.v) || math.IsInf(f.v, 0):
			errs = append(errs, fmt.Errorf("profile %q: %s %v: want a finite number", p.Name, f.key, f.v))
		case f.positive && f.v <= 0:
			errs = append(errs, fmt.Errorf("profile %q: %s %v: want > 0", p.Name, f.key, f.v))
		case f.v < 0:
			errs = append(errs, fmt.Errorf("profile %q: %s %v: must not be negative", p.Name, f.key, f.v))
		}
	}
	for _, f := range []struct {
		key string
		v   int
	}{{"layers", p.Layers}, {"hidden", p.Hidden}} {
		if f.v < 0 { // each by itself: "hidden 0" beside it read as negative
			errs = append(errs, fmt.Errorf("profile %q: %s %d: must not be negative", p.Name, f.key, f.v))
		}
	}
	if p.StepOverhead < 0 || p.PerSeqOverhead < 0 {
		errs = append(errs, fmt.Errorf("profile %q: overheads must not be negative", p.Name))
	}
	if p.MaxNumSeqs < 0 || p.MaxNumBatchedTokens < 0 {
		errs = append(errs, fmt.Errorf("profile %q: batch defaults must not be negative", p.Name))
	}
	return errs
}

// Plausibility bounds for a profile file (plausible): a lone decode step
// of one sequence of plausibleContext tokens, and a lone prefill of as
// many, take at most this long on any real GPU. A profile past them almost
// surely has a unit mistake (TFLOP/s or GB/s where FLOP/s and bytes/s are
// wanted), which would otherwise make the discrete-event runs crawl
// through hours of virtual time per step.
const (
	plausibleContext    = 1024
	plausibleDecodeStep = 10 * time.Second
	plausiblePrefill    = 10 * time.Minute
)

// plausible lists why p cannot be a real model on a real GPU: a decode
// step or a prefill past the bounds above, naming the fields behind it and
// the unit mistake that would explain them. p must be valid.
func (p *Profile) plausible() []error {
	var errs []error
	n := float64(plausibleContext)
	check := func(what string, limit time.Duration, flops, bytes float64) {
		overhead := p.StepOverhead.Seconds() + p.PerSeqOverhead.Seconds()
		compute, memory := flops/p.FLOPS, bytes/p.MemBW
		total := overhead + max(compute, memory)
		if total <= limit.Seconds() {
			return
		}
		// Every term over the limit on its own is a mistake; when none
		// is, the largest.
		var why []string
		for _, t := range []struct {
			sec  float64
			desc func() string
		}{
			{overhead, func() string {
				return fmt.Sprintf("stepOverhead %v + perSeqOverhead %v (Go durations, e.g. 2ms and 20us)", p.StepOverhead, p.PerSeqOverhead)
			}},
			{compute, func() string {
				d := fmt.Sprintf("%.3g FLOPs at flops %g FLOP/s take %.3g s", flops, p.FLOPS, compute)
				switch {
				case p.FLOPS >= 1 && p.FLOPS < 1e9:
					d += fmt.Sprintf(" (flops is FLOP/s, not TFLOP/s: %g TFLOP/s is flops: %ge12)", p.FLOPS, p.FLOPS)
				case p.FLOPS < 1e9:
					d += " (flops is FLOP/s: an H100 sustains about 400e12)"
				}
				return d
			}},
			{memory, func() string {
				d := fmt.Sprintf("%.3g bytes (weightBytes + kvBytesPerToken × %d) at memBW %g bytes/s take %.3g s", bytes, plausibleContext, p.MemBW, memory)
				switch {
				case p.MemBW >= 1 && p.MemBW < 1e8:
					d += fmt.Sprintf(" (memBW is bytes/s, not GB/s: %g GB/s is memBW: %ge9)", p.MemBW, p.MemBW)
				case p.MemBW < 1e8:
					d += " (memBW is bytes/s: an H100's HBM sustains about 2.7e12)"
				}
				return d
			}},
		} {
			if t.sec > limit.Seconds() {
				why = append(why, t.desc())
			}
		}
		if len(why) == 0 {
			switch {
			case overhead >= max(compute, memory):
				why = append(why, "the overheads dominate")
			case compute >= memory:
				why = append(why, fmt.Sprintf("compute dominates (flops %g FLOP/s)", p.FLOPS))
			default:
				why = append(why, fmt.Sprintf("memory traffic dominates (memBW %g bytes/s)", p.MemBW))
			}
		}
		errs = append(errs, fmt.Errorf("profile %q: %s takes %.3g s, over %v (a unit mistake?): %s",
			p.Name, what, total, limit, strings.Join(why, "; ")))
	}
	attn := 4 * float64(p.Layers) * float64(p.Hidden)
	check(fmt.Sprintf("a lone decode step of one sequence of %d tokens", plausibleContext), plausibleDecodeStep,
		2*p.Params+attn*n, p.WeightBytes+p.KVBytesPerToken*n)
	check(fmt.Sprintf("a lone %d-token prefill", plausibleContext), plausiblePrefill,
		2*p.Params*n+attn*n*(n+1)/2, p.WeightBytes+p.KVBytesPerToken*n)
	return errs
}

// stepWork is what one step computes; the scheduler accumulates it.
type stepWork struct {
	seqs       int     // sequences in the batch
	tokens     int     // tokens computed (prefill chunks + one per decode)
	attnPairs  float64 // Σ q·(c + (q+1)/2): query·key pairs under a causal mask
	ctxTokens  float64 // Σ (c+q): KV entries read
	loadTokens int     // tokens loaded from the CPU tier
}

// stepTime is the duration of a step doing w under profile p.
func (p *Profile) stepTime(w *stepWork) time.Duration {
	flops := 2*p.Params*float64(w.tokens) + 4*float64(p.Layers)*float64(p.Hidden)*w.attnPairs
	bytes := p.WeightBytes + p.KVBytesPerToken*w.ctxTokens
	sec := max(flops/p.FLOPS, bytes/p.MemBW)
	if w.loadTokens > 0 && p.HostBW > 0 {
		sec += p.KVBytesPerToken * float64(w.loadTokens) / p.HostBW
	}
	d := maxStepTime
	if ns := sec * 1e9; ns < float64(maxStepTime) { // false for NaN
		d = time.Duration(ns)
	}
	d = addStep(d, p.StepOverhead)
	if w.seqs > 0 && p.PerSeqOverhead > 0 {
		if time.Duration(w.seqs) > maxStepTime/p.PerSeqOverhead {
			d = maxStepTime
		} else {
			d = addStep(d, time.Duration(w.seqs)*p.PerSeqOverhead)
		}
	}
	if d < time.Microsecond {
		d = time.Microsecond // a step always takes time, so virtual time advances
	}
	return d
}

// maxStepTime (2^50 ns, about 13 days) is where a step's duration
// saturates: far past any real step (a profile file must pass plausible),
// and small enough that a virtual clock can add thousands of such steps
// without overflowing a time.Duration. Without it a profile in the wrong
// units overflowed the conversion into a negative duration, clamped to
// 1 µs: free steps.
const maxStepTime = time.Duration(1 << 50)

// addStep is a + b for non-negative durations, saturating at maxStepTime.
func addStep(a, b time.Duration) time.Duration {
	if b > 0 && a > maxStepTime-b {
		return maxStepTime
	}
	return a + b
}

// PrefillTime is the modelled duration of a lone prefill of n uncached tokens
// after c cached ones (documentation and tests).
func (p *Profile) PrefillTime(c, n int) time.Duration {
	w := stepWork{seqs: 1, tokens: n, attnPairs: float64(n) * (float64(c) + float64(n+1)/2), ctxTokens: float64(c + n)}
	return p.stepTime(&w)
}

// DecodeStepTime is the modelled duration of one decode step of a batch of
// seqs sequences holding ctx context tokens in total.
func (p *Profile) DecodeStepTime(seqs, ctx int) time.Duration {
	w := stepWork{seqs: seqs, tokens: seqs, attnPairs: float64(ctx), ctxTokens: float64(ctx)}
	return p.stepTime(&w)
}

// Rates is the profile reduced to the three numbers a router's cost model
// uses (docs and tests compare a learned cost model with it; no router is
// given it): prefill tokens per second of the linear layers, a decode
// step's fixed cost (overhead plus reading the weights) in seconds, and a
// decode step's cost per context token (reading its KV) in seconds.
func (p *Profile) Rates() (prefillRate, stepBase, decodeSecPerToken float64) {
	if p.Params > 0 && p.FLOPS > 0 {
		prefillRate = p.FLOPS / (2 * p.Params)
	}
	if p.MemBW > 0 {
		stepBase = p.StepOverhead.Seconds() + p.WeightBytes/p.MemBW
		decodeSecPerToken = p.KVBytesPerToken / p.MemBW
	}
	return prefillRate, stepBase, decodeSecPerToken
}

// ProfileFile is the documented file form of a Profile (JSON or YAML; the
// file's keys are the yaml names below), for `--profile-file`: users model
// their own GPU and model with it. Every field is required except the
// overheads, HostBW and the batch defaults. Numbers are YAML 1.2 numbers
// (362e12 needs no dot; 1_000 and 0x10 read too), the batch defaults whole
// ones; a quoted "362e12" is a string and an error naming its key.
//
//	name: my-13b-a100          # label in reports
//	params: 13.0e9             # parameters; linear-layer FLOPs = 2·params per token
//	weightBytes: 26.0e9        # bytes of weights read every step
//	layers: 40                 # transformer layers (attention FLOPs)
//	hidden: 5120               # model width (attention FLOPs = 4·layers·hidden per query·key pair)
//	kvBytesPerToken: 819200    # K and V bytes per token, all layers
//	flops: 125.0e12            # sustained FLOP/s (peak × achievable utilisation)
//	memBW: 1.6e12              # sustained HBM bytes/s
//	hostBW: 20.0e9             # host↔GPU bytes/s for CPU-tier loads (0: no CPU tier cost)
//	stepOverhead: 2ms          # scheduler + launch overhead per step (Go duration)
//	perSeqOverhead: 20us       # per sequence per step
//	maxNumSeqs: 256            # vLLM --max-num-seqs default on this GPU (0: engine default)
//	maxNumBatchedTokens: 2048  # vLLM --max-num-batched-tokens default (0: engine default)
type ProfileFile struct {
	Name                string  `yaml:"name"`
	Params              float64 `yaml:"params"`
	WeightBytes         float64 `yaml:"weightBytes"`
	Layers              int     `yaml:"layers"`
	Hidden              int     `yaml:"hidden"`
	KVBytesPerToken     float64 `yaml:"kvBytesPerToken"`
	FLOPS               float64 `yaml:"flops"`
	MemBW               float64 `yaml:"memBW"`
	HostBW              float64 `yaml:"hostBW"`
	StepOverhead        string  `yaml:"stepOverhead"`
	PerSeqOverhead      string  `yaml:"perSeqOverhead"`
	MaxNumSeqs          int     `yaml:"maxNumSeqs"`
	MaxNumBatchedTokens int     `yaml:"maxNumBatchedTokens"`
}

// LoadProfileFile reads a ProfileFile (YAML, or JSON which is YAML) and
// returns the Profile it describes; unknown keys and invalid values are
// errors wrapping ErrProfileFile.
func LoadProfileFile(path string) (Profile, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Profile{}, fmt.Errorf("%w: %w", ErrProfileFile, err)
	}
	return ParseProfile(b)
}

// ParseProfile decodes a ProfileFile document (see LoadProfileFile): one
// YAML document, a second one is an error (it was silently ignored), as is
// a file with none.
func ParseProfile(b []byte) (Profile, error) {
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(b))
	switch err := dec.Decode(&doc); {
	case errors.Is(err, io.EOF):
		return Profile{}, fmt.Errorf("%w: the file is empty (want a YAML mapping of the profile's fields: name, params, weightBytes, ...)", ErrProfileFile)
	case err != nil:
		return Profile{}, fmt.Errorf("%w: %w", ErrProfileFile, err)
	}
	var errs []error
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		errs = append(errs, fmt.Errorf("second YAML document: %w (one profile per file)", err))
	case !nullDocument(&next):
		errs = append(errs, fmt.Errorf("line %d: a second YAML document is not allowed (one profile per file)", next.Line))
	}
	if bad := checkProfileKeys(&doc); len(bad) > 0 { // what the decoder would say less well, or not at all
		return Profile{}, fmt.Errorf("%w: %w", ErrProfileFile, errors.Join(append(bad, errs...)...))
	}
	var f ProfileFile
	if err := doc.Decode(&f); err != nil { // unknown keys were refused above
		err = fmt.Errorf("%w (want a YAML mapping of the profile's fields: %s)", err, strings.Join(profileKeys, ", "))
		return Profile{}, fmt.Errorf("%w: %w", ErrProfileFile, errors.Join(append([]error{err}, errs...)...))
	}
	p := Profile{Name: f.Name, Params: f.Params, WeightBytes: f.WeightBytes, Layers: f.Layers, Hidden: f.Hidden,
		KVBytesPerToken: f.KVBytesPerToken, FLOPS: f.FLOPS, MemBW: f.MemBW, HostBW: f.HostBW,
		MaxNumSeqs: f.MaxNumSeqs, MaxNumBatchedTokens: f.MaxNumBatchedTokens}
	for _, d := range []struct {
		s   string
		dst *time.Duration
		key string
	}{{f.StepOverhead, &p.StepOverhead, "stepOverhead"}, {f.PerSeqOverhead, &p.PerSeqOverhead, "perSeqOverhead"}} {
		if d.s == "" {
			continue
		}
		v, err := time.ParseDuration(d.s)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", d.key, err))
		}
		*d.dst = v
	}
	if p.Name == "" {
		p.Name = "custom"
	}
	if p.Layers <= 0 || p.Hidden <= 0 || p.KVBytesPerToken <= 0 || p.WeightBytes <= 0 {
		errs = append(errs, fmt.Errorf("profile %q: layers, hidden, kvBytesPerToken and weightBytes must be > 0", p.Name))
	}
	if v := p.validate(); len(v) > 0 {
		errs = append(errs, v...)
	} else {
		errs = append(errs, p.plausible()...) // on valid numbers only: it divides by them
	}
	if len(errs) > 0 {
		return Profile{}, fmt.Errorf("%w: %w", ErrProfileFile, errors.Join(errs...))
	}
	return p, nil
}

// nullDocument reports whether n, a decoded YAML document, holds nothing
// (a trailing "---" alone).
func nullDocument(n *yaml.Node) bool {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return true
		}
		n = n.Content[0]
	}
	return n.Kind == 0 || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}
