package scheduler

import (
	"time"

	"github.com/kvmesh/kvmesh/index"
)

// Role is an engine's (or a request's) place in prefill/decode
// disaggregation. The zero value is RoleMixed.
type Role uint8

const (
	RoleMixed Role = iota
	RolePrefill
	RoleDecode
)

// String returns the role's lower-case name.
func (r Role) String() string {
	switch r {
	case RolePrefill:
		return "prefill"
	case RoleDecode:
		return "decode"
	default:
		return "mixed"
	}
}

// ParseRole maps "mixed" (or ""), "prefill" and "decode" to a Role.
func ParseRole(s string) (Role, bool) {
	switch s {
	case "", "mixed":
		return RoleMixed, true
	case "prefill":
		return RolePrefill, true
	case "decode":
		return RoleDecode, true
	}
	return RoleMixed, false
}

// Request is what the scheduler knows about one request.
type Request struct {
	// Keys are the chain keys of every full block of the prompt
	// (DESIGN.md Contract 1), in order.
	Keys []uint64
	// BlockSize is tokens per block of Keys: the engines' block size, the
	// most common one's when a model's engines differ (Chains).
	BlockSize int
	// Chains are the prompt's chain keys at the candidates' other block
	// sizes, one per size, when a model's engines report more than one
	// (nil when they all use BlockSize, the usual case). An engine whose
	// BlockSize is one of them is looked up with that chain, so its Match
	// counts its own blocks; one whose size has neither Keys nor a chain
	// matches nothing. Without Chains every engine is looked up with Keys.
	Chains []Chain
	// PromptTokens is the prompt length, including the partial last block.
	PromptTokens int
	// OutputTokens is the expected output length (max_tokens or an
	// estimate); 0 lets scorers assume a default.
	OutputTokens int
	Model        string
	LoRA         string // adapter name, "" for the base model
	Role         Role   // RoleMixed: any engine; RolePrefill/RoleDecode: that role or mixed
	// SessionID is the client's session header ("" for none); SessionEngine
	// is where the session's previous turn went (the ingress's session
	// store supplies it), "" when unknown.
	SessionID     string
	SessionEngine string
	// Now is the decision time (wall clock in the ingress, virtual in the
	// DES).
	Now time.Time
}

// Chain is a prompt's chain keys at one block size.
type Chain struct {
	BlockSize int
	Keys      []uint64
}

// chainFor is the chain engine e is looked up with (its block size and
// keys) and whether the request has one for it (Chains).
func (r *Request) chainFor(e *Engine) (int, []uint64, bool) {
	if e.BlockSize <= 0 || e.BlockSize == r.BlockSize {
		return r.BlockSize, r.Keys, true
	}
	for i := range r.Chains {
		if r.Chains[i].BlockSize == e.BlockSize {
			return e.BlockSize, r.Chains[i].Keys, true
		}
	}
	return e.BlockSize, nil, false
}

// Blocks is the request's full-block count (len(Keys)), at least 1 so
// ratios never divide by zero.
func (r *Request) Blocks() int {
	if len(r.Keys) == 0 {
		return 1
	}
	return len(r.Keys)
}

// Engine is one candidate engine's state as the router sees it. Fields
// marked "snapshot" arrive by gossip (or the DES's periodic snapshot) and
// are stale by up to one period; fields marked "local" are the router's own
// bookkeeping and are fresh.
type Engine struct {
	ID      string
	Healthy bool
	Model   string
	Role    Role
	// Group is the engine's P/D group (gossip metadata or a label): a
	// prefill engine's KV can be read only by decode engines of the same
	// group. "" is a group of its own like any other value.
	Group string
	// PDProtocol is the engine's P/D wire protocol ("" for vLLM's NIXL
	// connector or none, "sglang" for SGLang's bootstrap rooms): a prefill
	// engine's KV can be read only by a decode engine speaking the same
	// one, so a pair needs equal Group and PDProtocol (pd.View.SameGroup).
	// It does not restrict aggregated serving.
	PDProtocol string
	LoRAs      []string // adapters currently loaded (snapshot)
	// PrefillOnly marks a prefill-role engine that cannot serve a whole
	// request (SGLang's disaggregation-mode prefill server). A vLLM engine
	// with NixlConnector's kv_role "kv_both" can, and the P/D step may send
	// it one when the decode engines cannot keep TPOT (scheduler/pd).
	PrefillOnly bool
	// BlockSize is the engine's KV block size in tokens (snapshot; 0:
	// unknown, taken as the request's). It matters only with
	// Request.Chains: then the engine's Match counts blocks of this size.
	BlockSize int

	Running             int     // snapshot: requests in the running batch
	Waiting             int     // snapshot: requests waiting to be scheduled
	KVUsage             float64 // snapshot: GPU KV cache usage, 0..1
	QueuedPrefillTokens int     // snapshot: prompt tokens not yet prefilled
	GPUBlocks           int     // snapshot: KV capacity in blocks (0 unknown)

	// InFlight counts requests routed to the engine and not finished, from
	// every ingress (local: this router's own, plus other ingresses'
	// via gossip).
	InFlight int
	// LocalPrefillTokens is the uncached prompt tokens of in-flight
	// requests that have not produced a first token yet (local).
	LocalPrefillTokens int
	// LocalActiveTokens is prompt plus expected output tokens of every
	// in-flight request (local): the engine's decode working set.
	LocalActiveTokens int
	// LocalKVTokens is the KV, in tokens, the in-flight requests (local)
	// hold on the engine: the distinct blocks of their prompts, a prefix
	// they share counted once as the engine holds it once
	// (LocalActiveTokens counts it per request), plus each one's prompt
	// tail and expected output. The P/D policy's KV wait reads it
	// (scheduler/pd, kvWait).
	LocalKVTokens int

	// TTFT and TPOT are recent observed latencies (zero when no sample yet).
	TTFT, TPOT time.Duration
}

// Queued is the requests waiting at the engine: the larger of its report
// (a snapshot, up to a scrape interval old) and the requests the routers
// have in flight there beyond its running batch (sent since, not yet in a
// report).
func (e *Engine) Queued() int { return max(e.Waiting, e.InFlight-e.Running) }

// Candidate is an engine under consideration for one request. The
// framework fills Match and Hit before scorers and policies run.
type Candidate struct {
	*Engine
	// Match is the engine's matched prefix depth per tier, in blocks of
	// the engine's size (MatchBlock): engines of one model that differ in
	// block size (Request.Chains) are compared by Hit and CachedTokens,
	// which do not depend on it.
	Match index.Match
	// MatchBlock is the tokens per block of Match: the request's
	// BlockSize, or with Request.Chains the engine's.
	MatchBlock int
	// Hit is the tier-weighted matched fraction of the request's blocks
	// (of the engine's chain), in [0,1] (Config.TierWeights).
	Hit float64
	// CachedTokens estimates how many prompt tokens the engine will not
	// have to prefill (weighted like Hit).
	CachedTokens int
	// Score is the policy's final score (higher is better), for ranking
	// and the access log.
	Score float64
}

// MatchBlockSize is the tokens per block of c.Match: MatchBlock, or r's
// BlockSize for a candidate the framework did not fill (built by hand).
func (c *Candidate) MatchBlockSize(r *Request) int {
	if c.MatchBlock > 0 {
		return c.MatchBlock
	}
	return r.BlockSize
}

// MatchTokens is n blocks of c.Match (one of its tiers, c.Match.GPU say)
// in tokens: n blocks of the engine's own size, which with Request.Chains
// need not be r.BlockSize.
func (c *Candidate) MatchTokens(r *Request, n int) int { return n * c.MatchBlockSize(r) }

// InRequestBlocks is x blocks of c.Match in blocks of r.BlockSize, the
// unit of r.Keys and r.Blocks(): x itself when the sizes agree.
func (c *Candidate) InRequestBlocks(r *Request, x float64) float64 {
	if bs := c.MatchBlockSize(r); bs != r.BlockSize && r.BlockSize > 0 {
		return x * float64(bs) / float64(r.BlockSize)
	}
	return x
}

// EngineScore is one engine's line in a Decision.
type EngineScore struct {
	Engine string
	Score  float64
	Match  index.Match
	// MatchBlock is the tokens per block of Match (Candidate.MatchBlock).
	MatchBlock int
	Hit        float64
}

// Decision is a routing decision. Reuse one per goroutine: Schedule
// overwrites it without allocating once its slices have grown.
type Decision struct {
	// Engine is the chosen engine id (Ranked[0].Engine).
	Engine string
	// Policy and Reason say why (Reason is a short constant string).
	Policy string
	Reason string
	// Ranked lists every candidate that passed the filters, best first:
	// the ingress retries down this list.
	Ranked []EngineScore
	// Filtered counts engines removed by filters.
	Filtered int
}
