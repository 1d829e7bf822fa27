package pd

import (
	"fmt"

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
// stall is n running × the request's uncached prefill time: on a decode
// engine it is TPOT lost by every running stream, on a prefill engine the
// TTFT lost by the prefills sharing its batch. kvwait is the part of the
// request's KV that does not fit in the decode engine's free blocks, as a
// fraction of its decode time (it waits for running requests to finish).
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
	// SLOWeight prices a second of predicted TTFT beyond SLOTTFT. Default 4.
	SLOWeight float64
	// Always disables the aggregated options on decode-role engines (mixed
	// engines still serve aggregated): kvmesh's pair choice without the
	// decision, for comparison.
	Always bool
}

var _ Policy = KVMesh{}

// NewKVMesh returns the policy with cost c and the transfer defaults.
func NewKVMesh(c policies.KVMesh) KVMesh {
	return KVMesh{Cost: c, KVBytesPerToken: 131072, TransferBandwidth: 12.5e9, TransferSetup: 0.002, SLOWeight: 4}
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
	for _, d := range v.Decoders {
		c := &v.Cands[d]
		_, step, _ := k.Cost.Rates(c.ID)
		if k.Always && c.Role == scheduler.RoleDecode && len(v.Prefillers) > 0 {
			continue
		}
		t := k.Cost.Terms(r, c, max(0, r.PromptTokens-c.CachedTokens))
		v.Add(-1, d, -(t.Total(step) + k.kvWait(r, c, t) + k.late(t.Queue+t.Prefill+step)))
	}
	for _, d := range v.Decoders {
		c := &v.Cands[d]
		// The decode engine computes only the last token itself (vLLM
		// recomputes it) and reads the rest.
		_, dstep, _ := k.Cost.Rates(c.ID)
		td := k.Cost.Terms(r, c, 0)
		dec := td.Queue + dstep + td.Decode + td.Crowd + k.kvWait(r, c, td)
		xfer := k.TransferSetup + float64(max(0, r.PromptTokens-c.CachedTokens))*k.KVBytesPerToken/k.TransferBandwidth
		for _, p := range v.Prefillers {
			if !v.SameGroup(p, d) {
				continue
			}
			cp := &v.Cands[p]
			prate, pstep, _ := k.Cost.Rates(cp.ID)
			unc := max(0, r.PromptTokens-cp.CachedTokens)
			tp := k.Cost.Terms(r, cp, unc)
			// A prefill engine runs a handful of prompts at a time, so
			// the aggregated model's cap of the queue behind at the
			// running count would hide its queue: every waiting prompt
			// waits for this one.
			waiting := float64(max(cp.Waiting, cp.InFlight-cp.Running))
			behind := (k.Cost.WaitingWeight*waiting + k.Cost.MissPenalty) * float64(unc) / prate
			ttft := tp.Queue + tp.Prefill + pstep + xfer + td.Queue + dstep
			v.Add(p, d, -(tp.Queue + tp.Prefill + tp.Stall + behind + pstep + xfer + dec + k.late(ttft)))
		}
	}
	best := 0
	for i := range v.Options {
		if v.Options[i].Score > v.Options[best].Score {
			best = i
		}
	}
	if len(v.Options) > 0 && v.Options[best].Aggregated() {
		if len(v.Prefillers) == 0 {
			return "aggregated-no-prefill"
		}
		return "aggregated-cheaper"
	}
	return "disaggregated-cheaper"
}

// late prices a predicted TTFT beyond the SLO.
func (k KVMesh) late(ttft float64) float64 {
	if k.SLOTTFT <= 0 || ttft <= k.SLOTTFT {
		return 0
	}
	return k.SLOWeight * (ttft - k.SLOTTFT)
}

// kvWait prices the request's KV that does not fit in c's free blocks: it
// waits, roughly, for that fraction of a decode lifetime.
func (k KVMesh) kvWait(r *scheduler.Request, c *scheduler.Candidate, t policies.Terms) float64 {
	if c.GPUBlocks <= 0 || r.BlockSize <= 0 {
		return 0
	}
	need := (r.PromptTokens+k.Cost.Output(r)+r.BlockSize-1)/r.BlockSize - c.Match.GPU
	free := (1 - c.KVUsage) * float64(c.GPUBlocks)
	if need <= 0 || float64(need) <= free {
		return 0
	}
	return (float64(need) - max(free, 0)) / float64(need) * t.Decode
}
