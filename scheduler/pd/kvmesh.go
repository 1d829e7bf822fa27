package pd

import (
	"fmt"
	"math"
	"time"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// KVMesh is kvmesh's P/D choice: every aggregated option and every pair of
// one group priced in seconds with the aggregated policy's cost model
// (policies.KVMesh.Terms), the cheapest wins. There is no threshold: a
// request is disaggregated when what its prefill would cost the decode
// engine's running streams (their TPOT) and its queue there is more than the
// prefill engine's queue plus the transfer of the blocks the decode engine
// lacks.
//
//	aggregated on d = queue_d + prefill_d + step + decode_d + stall_d + crowd_d + behind_d + kvwait_d
//	pair (p, d)     = queue_p + prefill_p + stall_p + behind_p + step        (prefill leg)
//	                + setup + (prompt − cached_d) · KVBytesPerToken / TransferBandwidth
//	                + queue_d + step + decode_d + crowd_d + kvwait_d       (decode leg)
//
// With MixedPrefill a mixed engine p may be the prefiller of a pair (never
// with itself); its prefill leg is priced as a local prefill there
// (queue_p + prefill_p + stall_p·w_p + behind_p + broken_p + step), and such
// pairs are offered only when every aggregated option's w ≥ ½. Likewise a
// prefill engine that can serve a whole request (not PrefillOnly) is an
// aggregated option, priced as one on a decode engine, only when the
// request's own TPOT would more likely than not miss the objective on
// every engine that decodes (not with Always).
//
// stall is n running × the request's uncached prefill time: on a decode
// engine it is TPOT lost by every running stream, on a prefill engine the
// TTFT lost by the prefills sharing its batch. kvwait is the time the
// request waits for KV on the decode engine: the blocks that must be freed
// before it fits (its need beyond the free blocks, and beyond the blocks
// the engine is already over-committed by) at the rate a full engine frees
// them, its capacity once per stream lifetime (output × TPOT); the blocks
// in use are the larger of the engine's KV usage report and the KV this
// router's in-flight requests hold there, and the wait is part of the TTFT
// the miss term prices. When on every engine that decodes the wait alone
// is past the TTFT objective, a prefill engine may serve the request whole
// (below).
//
// With SLOs (SLOTTFT, SLOTPOT) the objective is goodput, so two terms are
// added and one is reweighted:
//
//	miss   = price · P(the request misses TTFT or TPOT)        (every option)
//	broken = price · n_d · ΔP(a running stream misses TPOT)    (aggregated on d)
//	stall_d ×= P(a running stream on d misses TPOT after the local prefill)
//
// where price = SLOWeight · (SLOTTFT + output · SLOTPOT), the latency the
// SLOs allow the request, and P is a logistic around the objective (width
// sloSpread of it). The TPOT a stream on d sees is d's measured TPOT (the
// metrics' recent mean; the learned step time until there is one) plus the
// prefill seconds this router sent to d as local prefills over the last
// half stream lifetime, spread over a stream's output (the stall ledger):
// the router's own decisions, which no engine metric shows in time. So a
// decode engine's spare TPOT budget serves prefills when the prefill pool's
// queue would miss the TTFT objective, and only as long as the budget lasts.
type KVMesh struct {
	Cost policies.KVMesh
	// KVBytesPerToken is the KV size of one prompt token (all layers).
	// Default 131,072 (a 7B MHA model in fp16).
	KVBytesPerToken float64
	// TransferBandwidth is prefill → decode KV bandwidth in bytes/s.
	// Default 12.5e9 (100 Gbit/s).
	TransferBandwidth float64
	// TransferSetup is a transfer's fixed cost in seconds (side-channel
	// handshake, the prefill leg's HTTP round trip). Default 0.002.
	TransferSetup float64
	// SLOTTFT, when > 0, is the time-to-first-token objective: an option
	// whose predicted TTFT exceeds it costs SLOWeight × the excess on top
	// (a request past its SLO no longer counts for goodput, so time beyond
	// it is worth more than time before it). 0 disables the term.
	SLOTTFT float64
	// SLOTPOT, when > 0, is the time-per-output-token objective (mean
	// over a request's decode).
	SLOTPOT float64
	// SLOWeight scales the price of a request missing its SLOs: SLOWeight ×
	// the latency the SLOs allow it (SLOTTFT + output × SLOTPOT). Default 1.
	SLOWeight float64
	// Always disables the aggregated options on decode-role engines (mixed
	// engines still serve aggregated) while some prefill engine may pair
	// with an engine that decodes: kvmesh's pair choice without the
	// decision, for comparison.
	Always bool
	// MixedPrefill lets mixed-role engines serve prefill legs too (vLLM's
	// NixlConnector with kv_role "kv_both"): a pair is any two distinct
	// engines of one group, the prefiller prefill or mixed, the decoder
	// decode or mixed. Pairs with a mixed prefiller are offered only under
	// a TPOT objective and when every aggregated option's local prefill
	// would more likely than not push its engine's streams past it. Off:
	// only prefill-role engines prefill for others.
	MixedPrefill bool
	// Outputs, when set, is the output-length distribution of the streams
	// engines run: a decode-role engine's running streams' risk from a local
	// prefill (w, broken) is priced over it instead of at the mean output
	// (OutputDist, streamRisk).
	Outputs *OutputDist

	stalls *stallLedger // the local prefills this router sent (NewKVMesh)
}

var (
	_ Policy              = KVMesh{}
	_ scheduler.Forgetter = KVMesh{}
)

// Forget implements scheduler.Forgetter: the engine's stall ledger goes.
func (k KVMesh) Forget(engine string) { k.stalls.forget(engine) }

// NewKVMesh returns the policy with cost c and the transfer defaults. The
// stall term is priced at full weight (c.StallWeight is set to 1): the P/D
// step weighs the running streams' lost seconds by their TPOT risk
// instead (streamRisk), and its tables were measured that way.
func NewKVMesh(c policies.KVMesh) KVMesh {
	c.StallWeight = 1
	return KVMesh{Cost: c, KVBytesPerToken: 131072, TransferBandwidth: 12.5e9, TransferSetup: 0.002, SLOWeight: 1,
		stalls: newStallLedger()}
}

// Validate lists every problem.
func (k KVMesh) Validate() error {
	err := k.Cost.Validate()
	if !(k.KVBytesPerToken >= 0) || !(k.TransferBandwidth > 0) || !(k.TransferSetup >= 0) {
		err = fmt.Errorf("pd kvmesh: %w: kvBytesPerToken %v and transferSetup %v must be ≥ 0, transferBandwidth %v > 0 (%v)",
			scheduler.ErrConfig, k.KVBytesPerToken, k.TransferSetup, k.TransferBandwidth, err)
	}
	return err
}

// Name implements Policy.
func (KVMesh) Name() string { return "kvmesh" }

// Choose implements Policy.
func (k KVMesh) Choose(r *scheduler.Request, v *View, _ *scheduler.Cycle) string {
	out := float64(max(k.Cost.Output(r), 1))
	// risk is the lowest chance, over the aggregated options, that the
	// running streams miss the TPOT objective after a local prefill; own
	// the lowest chance, over the engines that decode, that the request
	// itself misses it there.
	// kvFull: on every engine that decodes, the request's wait for KV
	// alone would more likely than not miss the TTFT objective.
	risk, own, kvFull := 1.0, 1.0, k.SLOTTFT > 0
	// paired: some prefill engine may pair with an engine that decodes
	// (one group, protocol and block size). Always offers no aggregated
	// option on a decode engine then, and as without prefill engines
	// otherwise.
	paired := false
	for _, d := range v.Decoders {
		if paired = v.paired(d); paired {
			break
		}
	}
	for _, d := range v.Decoders {
		if k.Always && paired && v.Cands[d].Role == scheduler.RoleDecode {
			continue
		}
		var wait float64
		risk, own, wait = k.addWhole(r, v, d, out, risk, own)
		kvFull = kvFull && wait >= k.SLOTTFT
	}
	if !k.Always && k.SLOTPOT > 0 && (own >= 0.5 || kvFull) {
		// No engine that decodes keeps this request within the TPOT
		// objective (P(miss) ≥ ½ on each), or none has the KV for it
		// before its TTFT objective has passed: a prefill engine that
		// can serve a whole request (vLLM's kv_role "kv_both") is
		// offered, priced as a local prefill and decode there. Its
		// streams decode between other requests' prefill legs, so while
		// the decode engines have TPOT and KV to spare it never is
		// (docs/BENCHMARKS.md, "Whole requests on prefill engines,
		// gated", and "The KV wait's form (2026-12-07)").
		for _, p := range v.Prefillers {
			if !v.Cands[p].PrefillOnly {
				risk, _, _ = k.addWhole(r, v, p, out, risk, own)
			}
		}
	}
	for _, d := range v.Decoders {
		c := &v.Cands[d]
		// The decode engine computes only the last token itself (vLLM
		// recomputes it) and reads the rest.
		_, dstep, _ := k.Cost.Rates(c.ID)
		td := k.Cost.Terms(r, c, 0)
		// A request waiting for KV on d waits before its first token.
		wait := k.kvWait(r, c, td)
		dec := td.Queue + dstep + td.Decode + td.Crowd + wait
		tpot := k.tpotNow(r, c, td, out)
		xfer := k.TransferSetup + float64(max(0, r.PromptTokens-c.CachedTokens))*k.KVBytesPerToken/k.TransferBandwidth
		for _, p := range v.Prefillers {
			if v.SameGroup(p, d) {
				k.addPair(r, v, p, d, out, xfer, dec, td.Queue+dstep+wait, tpot)
			}
		}
		if !k.MixedPrefill || k.SLOTPOT <= 0 || risk < 0.5 {
			// A mixed engine's prefill leg stalls its own streams as a
			// local prefill would: splitting across two mixed engines
			// pays only when no engine can prefill the request locally
			// and keep its streams within the TPOT objective (predicted
			// TPOT after ≥ SLOTPOT on every one, pMiss ≥ ½).
			continue
		}
		for _, p := range v.Mixed {
			if p != d && v.SameGroup(p, d) {
				k.addPair(r, v, p, d, out, xfer, dec, td.Queue+dstep+wait, tpot)
			}
		}
	}
	best := 0
	for i := range v.Options {
		if v.Options[i].Score > v.Options[best].Score {
			best = i
		}
	}
	if len(v.Options) > 0 && v.Options[best].Aggregated() {
		if len(v.Prefillers) == 0 && (!k.MixedPrefill || len(v.Mixed) < 2) {
			return "aggregated-no-prefill"
		}
		if v.Cands[v.Options[best].Decode].Role == scheduler.RolePrefill {
			return "aggregated-on-prefill"
		}
		if !paired && (!k.MixedPrefill || len(v.Mixed) < 2) {
			return "aggregated-no-pair"
		}
		return "aggregated-cheaper"
	}
	if k.Always {
		return "disaggregated-always"
	}
	return "disaggregated-cheaper"
}

// addWhole adds the aggregated option on d (prefilled and decoded there)
// and returns risk and own lowered by its streams' and the request's TPOT
// miss chances, and the request's KV wait there.
func (k KVMesh) addWhole(r *scheduler.Request, v *View, d int, out, risk, own float64) (float64, float64, float64) {
	c := &v.Cands[d]
	_, step, _ := k.Cost.Rates(c.ID)
	t := k.Cost.Terms(r, c, max(0, r.PromptTokens-c.CachedTokens))
	now := k.tpotNow(r, c, t, out)
	after := now + t.Prefill/out
	var broken float64
	if k.SLOTPOT > 0 {
		// Under a TPOT objective the running streams' lost seconds
		// matter as far as they risk it: a stream well inside its
		// objective loses nothing it is judged by.
		risk = min(risk, pMiss(after, k.SLOTPOT))
		own = min(own, pMiss(now, k.SLOTPOT))
		w := k.streamRisk(r.Model, c.Role, now, after, t.Prefill)
		t.Stall *= w
		broken = k.broken(c, out, now, w)
	}
	wait := k.kvWait(r, c, t)
	cost := t.Total(step) + wait
	cost += k.miss(out, t.Queue+t.Prefill+step+wait, now) + broken
	v.Add(-1, d, -cost)
	return risk, own, wait
}

// addPair adds the option prefill on p, decode on d. xfer is the transfer
// to d, dec the decode leg's cost, dstart the decode leg's part of the TTFT
// and tpot the TPOT a stream on d would see.
//
// A prefill-role engine runs a handful of prompts at a time, so the
// aggregated model's cap of the queue behind at the running count would
// hide its queue: every waiting prompt waits for this one. A mixed engine
// as prefiller is decoding streams too: its prefill leg is priced as a
// local prefill there (stall on its running streams' TPOT, reweighted by
// their objective, and the streams it breaks), except that it decodes
// nothing itself.
func (k KVMesh) addPair(r *scheduler.Request, v *View, p, d int, out, xfer, dec, dstart, tpot float64) {
	cp := &v.Cands[p]
	prate, pstep, _ := k.Cost.Rates(cp.ID)
	unc := max(0, r.PromptTokens-cp.CachedTokens)
	tp := k.Cost.Terms(r, cp, unc)
	ttft := tp.Queue + tp.Prefill + pstep + xfer + dstart
	leg := tp.Queue + tp.Prefill + pstep
	if cp.Role == scheduler.RolePrefill {
		waiting := float64(cp.Queued())
		leg += tp.Stall + (k.Cost.WaitingWeight*waiting+k.Cost.MissPenalty)*float64(unc)/prate
	} else {
		stall := tp.Stall
		if k.SLOTPOT > 0 {
			now := k.tpotNow(r, cp, tp, out)
			w := k.streamRisk(r.Model, cp.Role, now, now+tp.Prefill/out, tp.Prefill)
			stall = stall*w + k.broken(cp, out, now, w)
		}
		leg += stall + tp.Behind
	}
	v.Add(p, d, -(leg + xfer + dec + k.miss(out, ttft, tpot)))
}

// Chosen records the plan's prefill in the stall ledger when it runs on an
// engine that decodes (a local prefill, or a mixed engine's prefill leg).
// The Router calls it with the best option.
func (k KVMesh) Chosen(r *scheduler.Request, v *View, o Option) {
	if k.stalls == nil {
		return
	}
	at := o.Decode
	if !o.Aggregated() {
		if v.Cands[o.Prefill].Role == scheduler.RolePrefill {
			return
		}
		at = o.Prefill
	}
	c := &v.Cands[at]
	rate, _, _ := k.Cost.Rates(c.ID)
	k.stalls.add(c.ID, r.Now, float64(max(0, r.PromptTokens-c.CachedTokens))/rate)
}

// tpotNow is the TPOT of a stream on c with the request added: the decode
// step (Terms.TPOT) plus the prefill seconds this router sent there over
// the last stream lifetime, spread over a stream's output.
func (k KVMesh) tpotNow(r *scheduler.Request, c *scheduler.Candidate, t policies.Terms, out float64) float64 {
	if k.SLOTPOT <= 0 {
		return t.TPOT
	}
	base, life := t.TPOT, out*t.TPOT
	if c.TPOT > 0 {
		// The engine's measured TPOT (its histogram's recent mean)
		// already holds the stalls of the streams that finished; the
		// running ones have lived half a lifetime on average.
		base, life = c.TPOT.Seconds(), life/2
	}
	return base + k.stalls.since(c.ID, r.Now.Add(-time.Duration(life*float64(time.Second))))/out
}

// missPrice is what a request missing its SLOs costs, in seconds: the
// latency the SLOs allow it (TTFT + output × TPOT), times SLOWeight.
func (k KVMesh) missPrice(out float64) float64 {
	return k.SLOWeight * (k.SLOTTFT + out*k.SLOTPOT)
}

// pMiss is the chance a predicted x exceeds the objective slo: a logistic
// of width slo·sloSpread (predictions are not exact: cache hits, the
// queue's mix and later arrivals move them).
func pMiss(x, slo float64) float64 {
	if slo <= 0 {
		return 0
	}
	return 1 / (1 + math.Exp(-(x-slo)/(slo*sloSpread)))
}

const sloSpread = 0.3

// miss prices the request's own chance of missing the SLOs with a
// predicted TTFT and TPOT.
func (k KVMesh) miss(out, ttft, tpot float64) float64 {
	if k.SLOTTFT <= 0 && k.SLOTPOT <= 0 {
		return 0
	}
	ok := (1 - pMiss(ttft, k.SLOTTFT)) * (1 - pMiss(tpot, k.SLOTPOT))
	return k.missPrice(out) * (1 - ok)
}

// streamRisk is the chance a running stream of model on an engine of role misses
// its TPOT objective after a prefill of stall seconds joins its steps: at
// the mean output (TPOT after), or, on a decode-role engine, over the
// observed output lengths when Outputs is set. A mixed engine's streams
// stay priced at the mean: measured on eight mixed engines, pricing them
// over the distribution made kvmesh pair more mixed prefillers, whose
// prefill stalls their own streams all the same, and lost goodput and
// TPOT tail (docs/BENCHMARKS.md, "kvmesh on mixed=8").
func (k KVMesh) streamRisk(model string, role scheduler.Role, now, after, stall float64) float64 {
	if role == scheduler.RoleDecode {
		if p, ok := k.Outputs.pMissStall(model, now, stall, k.SLOTPOT); ok {
			return p
		}
	}
	return pMiss(after, k.SLOTPOT)
}

// broken prices the streams running on c whose TPOT a local prefill moves
// from before (TPOT) to a miss chance of risk: the chance each now misses
// its TPOT objective.
func (k KVMesh) broken(c *scheduler.Candidate, out, before, risk float64) float64 {
	if k.SLOTPOT <= 0 {
		return 0
	}
	n := float64(max(c.Running, c.InFlight-c.Waiting))
	return k.missPrice(out) * n * max(0, risk-pMiss(before, k.SLOTPOT))
}

// kvWait is how long the request waits for KV on c: the blocks c must free
// before the request fits (its need minus the free blocks; free is negative
// when the requests in flight already over-commit c, and then the request
// waits behind theirs too) at the rate a full engine frees blocks, all of
// them once per stream lifetime (Little's law; the lifetime is output ×
// TPOT, unweighted: the wait is seconds before the first token, not a
// share of the decode cost DecodeWeight discounts). It grows smoothly from
// zero where the request just fits and has no cap. The earlier form, the
// missing fraction of the request's own need times its weighted decode
// time, reached its cap (the weighted decode time, 0.3 s on tool-agent)
// once no block was free and stayed there however over-committed the
// engine was: once every decode engine was full, the router sent requests
// to one with a queue waiting for KV, where they waited and preempted
// (docs/BENCHMARKS.md, "The KV wait's form (2026-12-07)").
//
// The blocks in use are the larger of the engine's report (KVUsage, a
// snapshot up to a scrape interval old) and the KV this router's in-flight
// requests hold there (LocalKVTokens): the requests it sent since the
// snapshot hold KV the report does not show yet. A prefix they share
// counts once, as the engine holds it once; counted per request (prompt
// plus output, LocalActiveTokens) it made an engine serving one shared
// prefix look fuller than it was (tester h-reg7 F1).
//
// Blocks are the engine's own (GPUBlocks is its report): with a model's
// engines of several sizes (Request.Chains) they need not be the request's,
// and c.Match counts blocks of c.MatchBlock.
func (k KVMesh) kvWait(r *scheduler.Request, c *scheduler.Candidate, t policies.Terms) float64 {
	bs := c.BlockSize
	if bs <= 0 {
		bs = c.MatchBlockSize(r)
	}
	if c.GPUBlocks <= 0 || bs <= 0 {
		return 0
	}
	need := (r.PromptTokens + k.Cost.Output(r) - c.MatchTokens(r, c.Match.GPU) + bs - 1) / bs
	used := max(c.KVUsage*float64(c.GPUBlocks), float64(c.LocalKVTokens)/float64(bs))
	free := float64(c.GPUBlocks) - used
	if need <= 0 || float64(need) <= free {
		return 0
	}
	return (float64(need) - free) / float64(c.GPUBlocks) * float64(max(k.Cost.Output(r), 1)) * t.TPOT
}
