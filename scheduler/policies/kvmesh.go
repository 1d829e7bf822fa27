package policies

import (
	"errors"
	"fmt"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
)

// CostModel supplies an engine's current cost estimate (learn.Learner
// learns one per engine from what the router observes).
type CostModel interface {
	Rates(engine string) learn.Rates
}

// KVMesh is kvmesh's default policy: route to the engine where the request
// adds the least total latency, in seconds, estimated with the same
// timing-model shape as the simulator (prefill compute-bound in uncached
// tokens, decode memory-bound in total context):
//
//	ttft  = (queued prefill tokens + this request's uncached tokens) / PrefillRate + StepBase
//	tpot  = StepBase + DecodeSecPerToken · (active tokens + this request's context)
//	own   = ttft + DecodeWeight · output · tpot
//	cost  = own + ExternalityWeight · n · (StallWeight · uncached / PrefillRate + DecodeWeight · output · DecodeSecPerToken · context)
//	        + WaitingWeight · min(w, n) · uncached / PrefillRate
//	        + MissPenalty · uncached / PrefillRate
//
// where n is the engine's running requests (the snapshot's running count:
// requests routed there since are counted in w, once). The ExternalityWeight term is what
// the request does to everyone already on the engine: its prefill stalls their
// next steps (continuous batching), and its context lengthens each of their
// decode steps. It is why a cache miss on a busy engine is expensive and a
// hit is worth keeping: routing on the request's own TTFT alone spreads a
// prefix over every engine and thrashes their caches.
//
// The waiting term is the same idea for time to first token: the engine
// serves its queue in arrival order, so this request's prefill delays every
// request that will queue behind it there — by Little's law about as many
// as are waiting now (w: the snapshot's waiting, or in-flight minus running
// when fresher). Near saturation that is what separates a good router from
// a bad one: each uncached token is paid for by a queue, so hits are worth
// more exactly where queues are long. w is capped at the running batch:
// under sustained overload queues grow without bound, the count stops
// predicting who will wait, and uncapped it starved long prompts onto a few
// engines (docs/BENCHMARKS.md, "waitingWeight").
//
// Queued prefill work is the larger of the engine's reported queue (a
// snapshot, stale) and this router's own in-flight uncached tokens (fresh),
// and w counts the requests sent since the snapshot as waiting, so a burst
// of decisions sees its own effect at once — no herding onto a stale
// "idle" engine. They are not running as well: counted in n and in w,
// within one snapshot each added 2.2 prefill times per uncached token
// there (0.2 as a stalled stream, 2 as a request queued behind), and a
// burst of short prompts was sorted by size instead of spread by work (docs/BENCHMARKS.md, "A burst of tiny prompts (stop
// 68)"). A hit is worth exactly the work it saves, so
// affinity wins until the hot engine's queue costs more than recomputing
// the prefix elsewhere — no death spiral of misses sent to an overloaded
// worker, and hot prefixes replicate only when that pays.
//
// Under overload the externality and waiting terms also sort requests by
// size: a long prompt costs StallWeight·n times its prefill (plus the
// requests waiting behind it) on an engine with many running requests, so
// long prompts settle on engines running few (long) requests and short
// ones on an engine running many short ones. That is size-based routing
// (short jobs never queue behind long ones), which is why mean TTFT halves
// at 4× the Mooncake trace's rate while the request count per engine
// becomes uneven. The price is paid at the end of such a burst: the long
// prompts' backlog drains last, so the run takes longer; StallWeight
// below 1 narrows that (it lets long prompts use the short-request
// engines' spare prefill time), and the router-side hold (Hold, hold.go)
// removes it: the backlog waits in the router, where it can still go to
// whichever engine frees room first, instead of in the engines' queues.
// The defaults sit at a local optimum: docs/BENCHMARKS.md lists the
// variants measured.
type KVMesh struct {
	// PrefillRate is prefill throughput in tokens/s. Default 30,000 (7B on
	// an H100-class GPU).
	PrefillRate float64
	// StepBase is a step's fixed cost in seconds (weights read, launch).
	// Default 0.007.
	StepBase float64
	// DecodeSecPerToken is the per-step cost of one token of context
	// (KV read). Default 1.9e-7 (0.5 MB/token at 2.7 TB/s).
	DecodeSecPerToken float64
	// DecodeWeight scales the decode part of the cost (0 = route on TTFT
	// alone). Default 0.15: the decode terms price an engine's current
	// batch as if it lasted the request's whole decode, but a busier
	// engine gets fewer of the next requests, so an imbalance lasts a few
	// decisions, not 128 steps. At 1 the policy gave up cache hits to even
	// out running counts (8 engines at light load: 9% more misses than
	// llm-d, p90 TTFT 3.5× higher); 0.1–0.15 kept every benchmark's e2e
	// and improved TTFT everywhere (docs/BENCHMARKS.md, "decodeWeight").
	DecodeWeight float64
	// DefaultOutputTokens is assumed when a request carries no output
	// estimate (the ingress's prediction from finished answers, capped by
	// max_tokens; none before the first answer without max_tokens).
	// Default 128.
	DefaultOutputTokens int
	// ExternalityWeight scales the cost imposed on the engine's running
	// requests (0 = route on the request's own latency). Default 1.
	ExternalityWeight float64
	// StallWeight scales the stall term: the decode seconds the engine's
	// running streams lose while this request prefills, weighed against
	// seconds of time to first token. Those seconds reach the streams'
	// end-to-end latency, not anyone's TTFT, so they are weighted as the
	// other decode-side seconds are (DecodeWeight, and the context's crowd
	// term, which carries it). Default 0.2. At 1 a long prompt priced n
	// times its prefill on an engine running n short streams and never
	// went there: under sustained load the engines running short requests
	// got a third of the others' prefill work (2× the Mooncake trace's
	// first 1,000 requests: 0.64 M uncached tokens against up to 2.04 M)
	// while the long prompts queued elsewhere. Chosen on the tuning rows
	// among 0–1 (docs/BENCHMARKS.md, "The stall weight" under
	// "Cross-validation (unseen traffic)"); the P/D policy (scheduler/pd)
	// keeps 1 and weights the stall by the streams' TPOT risk instead.
	StallWeight float64
	// MissPenalty prices cache pollution: computing uncached tokens on an
	// engine whose cache is full evicts blocks future requests may need, so
	// each uncached token also costs MissPenalty times its prefill time.
	// It keeps a prefix on one engine instead of copying it around under
	// transient load. Default 1.
	MissPenalty float64
	// WaitingWeight scales the delay this request's prefill imposes on the
	// requests that will queue behind it (0 = ignore queues beyond the own
	// wait). Default 2.
	WaitingWeight float64
	// BalanceBound (ε) bounds the queue any one engine may build relative
	// to the others: an engine whose outstanding requests exceed
	// (1+ε)·the cluster mean + BalanceRequests, or whose queued prefill
	// work with this request's own added exceeds (1+ε)·the cluster mean +
	// BalanceSeconds + the request's smallest prefill anywhere, loses to
	// every engine within the bound, whatever its cache holds. The cost
	// terms above price one request at a time; without a bound their sum
	// let size-based routing pile short requests on one engine and long
	// ones on a few others (request imbalance 4.18 at twice the Mooncake
	// trace's rate, p99 1.5× the best emulation's at 1×). The second
	// clause is the long prompt that would block a cache-holding engine:
	// its prefill is work queued ahead of every later hit there. 0
	// disables the bound. Default 0 (off): on the whole Mooncake trace at
	// its own rate (a tuning row) ε = 0.25 spilled hits under load (hit
	// rate 0.32 → 0.18) and mean TTFT went from 5.0 to 21 s; on its first
	// 1,000 requests and on shared-prefix it bounded imbalance and p99
	// (docs/BENCHMARKS.md, "Cross-validation (unseen traffic)").
	BalanceBound float64
	// BalanceRequests and BalanceSeconds are the bound's absolute slack
	// (in requests and in seconds of prefill), so a near-idle cluster
	// keeps its cache affinity. Defaults 4 and 1 (2 requests gave up hits
	// on 3 engines: mean TTFT 1.10 against 0.75 s on the 2×-slower engine
	// of loadtest/des's ordering test; 4 kept them and, on the tuning set,
	// Mooncake's imbalance at 1.22).
	BalanceRequests, BalanceSeconds float64
	// SaturationQueue: when every engine has at least SaturationQueue
	// seconds of prefill queued (this router's own, or the engine's
	// reported queue), the cluster is saturated and the policy routes on
	// least work: queued prefill + this request's uncached prefill
	// (MissPenalty included, so a hit still counts twice). Per-request
	// externality terms stop being meaningful there (every engine's
	// batch is full and every queue long); balancing the work is what
	// keeps the tail and the throughput. A waiting count alone does not
	// qualify: short bursts put a few requests in every queue, and least
	// work there gave up the hits (mean TTFT 0.26 against 0.16 s on the
	// ordering test's shared-prefix load). 0 disables. Default 0 (off):
	// on the whole Mooncake trace at its own rate 0.5 s made every
	// long-prompt queue "saturated" and gave up the hits (mean TTFT 5.0 →
	// 21 s); 0.5 is what the cross-validation ran with the bound.
	SaturationQueue float64
	// Hold is the router-side hold (hold.go): the router, not the engines,
	// keeps the backlog once every engine has Hold.Seconds of this
	// router's prefill queued. The policy itself does not hold (Pick
	// ranks engines); the ingress and the benchmark that run it do.
	Hold Hold
	// Costs, when set, replaces PrefillRate, StepBase and DecodeSecPerToken
	// per engine by its learned estimate (the fields are then unused).
	Costs CostModel
}

var _ scheduler.Policy = KVMesh{}

// KVMeshConfig is the kvmesh block of a SchedulerConfig: the cost-model
// parameters, each documented on KVMesh's field of the same name.
type KVMeshConfig struct {
	PrefillRate         float64 `yaml:"prefillRate"`
	StepBase            float64 `yaml:"stepBase"`
	DecodeSecPerToken   float64 `yaml:"decodeSecPerToken"`
	DecodeWeight        float64 `yaml:"decodeWeight"`
	DefaultOutputTokens int     `yaml:"defaultOutputTokens"`
	ExternalityWeight   float64 `yaml:"externalityWeight"`
	StallWeight         float64 `yaml:"stallWeight"`
	MissPenalty         float64 `yaml:"missPenalty"`
	WaitingWeight       float64 `yaml:"waitingWeight"`
	BalanceBound        float64 `yaml:"balanceBound"`
	BalanceRequests     float64 `yaml:"balanceRequests"`
	BalanceSeconds      float64 `yaml:"balanceSeconds"`
	SaturationQueue     float64 `yaml:"saturationQueue"`
	HoldSeconds         float64 `yaml:"holdSeconds"`
	HoldAging           float64 `yaml:"holdAging"`
	HoldAffinity        float64 `yaml:"holdAffinity"`
}

// DefaultKVMeshConfig is the kvmesh policy's default cost model (a 7B model
// on an H100).
func DefaultKVMeshConfig() KVMeshConfig {
	return KVMeshConfig{PrefillRate: 30000, StepBase: 0.007, DecodeSecPerToken: 1.9e-7, DecodeWeight: 0.15,
		DefaultOutputTokens: 128, ExternalityWeight: 1, StallWeight: 0.2, MissPenalty: 1, WaitingWeight: 2,
		BalanceBound: 0, BalanceRequests: 4, BalanceSeconds: 1, SaturationQueue: 0,
		HoldSeconds: 2, HoldAging: 0.5, HoldAffinity: 0.5}
}

// Validate lists every problem, with paths under name.
func (k KVMeshConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.Positive("prefillRate", k.PrefillRate)
	p.NonNegative("stepBase", k.StepBase)
	p.NonNegative("decodeSecPerToken", k.DecodeSecPerToken)
	p.NonNegative("decodeWeight", k.DecodeWeight)
	p.NonNegativeInt("defaultOutputTokens", k.DefaultOutputTokens)
	p.NonNegative("externalityWeight", k.ExternalityWeight)
	p.NonNegative("stallWeight", k.StallWeight)
	p.NonNegative("missPenalty", k.MissPenalty)
	p.NonNegative("waitingWeight", k.WaitingWeight)
	p.NonNegative("balanceBound", k.BalanceBound)
	p.NonNegative("balanceRequests", k.BalanceRequests)
	p.NonNegative("balanceSeconds", k.BalanceSeconds)
	p.NonNegative("saturationQueue", k.SaturationQueue)
	p.NonNegative("holdSeconds", k.HoldSeconds)
	p.NonNegative("holdAging", k.HoldAging)
	p.NonNegative("holdAffinity", k.HoldAffinity)
	return errors.Join(p.Errs()...)
}

// KVMeshFactory is policy kvmesh's scheduler.PolicyFactory.
func KVMeshFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultKVMeshConfig())
	if err != nil {
		return nil, err
	}
	return KVMeshFrom(c), nil
}

// NewKVMesh returns KVMesh with its defaults (DefaultKVMeshConfig).
func NewKVMesh() KVMesh { return KVMeshFrom(DefaultKVMeshConfig()) }

// KVMeshFrom returns the policy configured by k.
func KVMeshFrom(k KVMeshConfig) KVMesh {
	return KVMesh{PrefillRate: k.PrefillRate, StepBase: k.StepBase, DecodeSecPerToken: k.DecodeSecPerToken,
		DecodeWeight: k.DecodeWeight, DefaultOutputTokens: k.DefaultOutputTokens, ExternalityWeight: k.ExternalityWeight,
		StallWeight: k.StallWeight, MissPenalty: k.MissPenalty, WaitingWeight: k.WaitingWeight, BalanceBound: k.BalanceBound,
		BalanceRequests: k.BalanceRequests, BalanceSeconds: k.BalanceSeconds, SaturationQueue: k.SaturationQueue,
		Hold: Hold{Seconds: k.HoldSeconds, Aging: k.HoldAging, Affinity: k.HoldAffinity}}
}

// Validate lists every problem.
func (p KVMesh) Validate() error {
	var errs []error
	if p.PrefillRate <= 0 {
		errs = append(errs, fmt.Errorf("kvmesh: prefillRate %v must be > 0", p.PrefillRate))
	}
	if p.StepBase < 0 || p.DecodeSecPerToken < 0 || p.DecodeWeight < 0 || p.DefaultOutputTokens < 0 || p.ExternalityWeight < 0 || p.StallWeight < 0 || p.MissPenalty < 0 || p.WaitingWeight < 0 ||
		p.BalanceBound < 0 || p.BalanceRequests < 0 || p.BalanceSeconds < 0 || p.SaturationQueue < 0 || p.Hold.Seconds < 0 || p.Hold.Aging < 0 || p.Hold.Affinity < 0 {
		errs = append(errs, fmt.Errorf("kvmesh: stepBase, decodeSecPerToken, decodeWeight, defaultOutputTokens, externalityWeight, stallWeight, missPenalty, waitingWeight, balanceBound, balanceRequests, balanceSeconds, saturationQueue, holdSeconds, holdAging and holdAffinity must be ≥ 0"))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("%w: %v", scheduler.ErrConfig, errs)
}

// Name implements scheduler.Policy.
func (KVMesh) Name() string { return "kvmesh" }

// Pick implements scheduler.Policy.
func (p KVMesh) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	cl := p.clusterLoad(r, cs)
	for i := range cs {
		cs[i].Score = -p.boundedCost(r, &cs[i], &cl)
	}
	pick := scheduler.ArgMax(cs, cyc)
	best := 0.0
	for i := range cs {
		best = max(best, cs[i].Hit)
	}
	switch {
	case cl.saturated:
		return pick, "saturated-least-work"
	case best == 0:
		return pick, "no-cache-least-cost"
	case cs[pick].Hit >= best:
		return pick, "prefix-affinity"
	default:
		return pick, "spill-over-cache" // the best cache is too busy (or past the balance bound)
	}
}
