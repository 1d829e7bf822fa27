package des

import (
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/sim/engine"
)

// EngineProfile is what a pre-deployment profiling run measures on one
// engine (as Dynamo's profiler does against the real engine before its
// SLA planner runs): prefill throughput at saturation, and decode time per
// output token by batch size. The SLO mode reads it; it is measured by
// running the engine, not read from the engine's timing model.
type EngineProfile struct {
	PromptTokens, OutputTokens int
	// PrefillTokensPerSecond one engine computes with a full queue.
	PrefillTokensPerSecond float64
	// Streams and TPOT: mean time per output token with that many
	// concurrent decode streams (KV already present, as after a transfer).
	Streams []int
	TPOT    []float64
}

// ProfileEngine measures cfg's engine with prompt and output tokens of the
// given (mean) lengths.
func ProfileEngine(cfg engine.Config, prompt, output int) (EngineProfile, error) {
	p := EngineProfile{PromptTokens: prompt, OutputTokens: output}
	cfg = cfg.Defaults()
	const prefills = 32
	fin, err := runPrefill(cfg, prefills, prompt)
	if err != nil {
		return p, err
	}
	p.PrefillTokensPerSecond = float64(prefills*prompt) / fin.Seconds()
	for n := 1; n <= cfg.MaxRunning; n *= 2 {
		tpot, err := decodeTPOT(cfg, n, prompt, output)
		if err != nil {
			return p, err
		}
		p.Streams, p.TPOT = append(p.Streams, n), append(p.TPOT, tpot)
	}
	return p, nil
}

// StreamsWithin is the most streams (interpolated) whose TPOT is ≤ tpot.
func (p EngineProfile) StreamsWithin(tpot float64) float64 {
	best := 0.0
	for i := range p.Streams {
		if p.TPOT[i] <= tpot {
			best = float64(p.Streams[i])
			continue
		}
		if i > 0 && p.TPOT[i-1] <= tpot {
			f := (tpot - p.TPOT[i-1]) / (p.TPOT[i] - p.TPOT[i-1])
			best = float64(p.Streams[i-1]) + f*float64(p.Streams[i]-p.Streams[i-1])
		}
		break
	}
	return best
}

// TPOTAt interpolates the TPOT at a stream count.
func (p EngineProfile) TPOTAt(streams float64) float64 {
	if len(p.Streams) == 0 {
		return 0
	}
	if streams <= float64(p.Streams[0]) {
		return p.TPOT[0]
	}
	for i := 1; i < len(p.Streams); i++ {
		if streams <= float64(p.Streams[i]) {
			f := (streams - float64(p.Streams[i-1])) / float64(p.Streams[i]-p.Streams[i-1])
			return p.TPOT[i-1] + f*(p.TPOT[i]-p.TPOT[i-1])
		}
	}
	return p.TPOT[len(p.TPOT)-1] * streams / float64(p.Streams[len(p.Streams)-1])
}

func profilePrompt(i, n int) []uint32 {
	pr := make([]uint32, n)
	for j := range pr {
		pr[j] = uint32(1000 + (i*7919+j*31)%30000)
	}
	return pr
}

// runPrefill runs n one-token requests submitted at once and returns the
// last finish.
func runPrefill(cfg engine.Config, n, prompt int) (time.Duration, error) {
	e, err := engine.New(cfg, nil)
	if err != nil {
		return 0, fmt.Errorf("profile: %w", err)
	}
	reqs := make([]*engine.Request, n)
	for i := range reqs {
		reqs[i] = &engine.Request{Prompt: profilePrompt(i, prompt), OutputLen: 1}
		if err := e.Add(reqs[i], 0); err != nil {
			return 0, fmt.Errorf("profile: %w", err)
		}
	}
	now := time.Duration(0)
	for !e.Idle() {
		res := e.Step(now, now+time.Hour)
		now = max(res.End, now+1)
	}
	return now, nil
}

func decodeTPOT(cfg engine.Config, n, prompt, output int) (float64, error) {
	e, err := engine.New(cfg, nil)
	if err != nil {
		return 0, fmt.Errorf("profile: %w", err)
	}
	reqs := make([]*engine.Request, n)
	for i := range reqs {
		pr := profilePrompt(i, prompt)
		e.ImportPrefix(pr, "", "", 0)
		reqs[i] = &engine.Request{Prompt: pr, OutputLen: max(output, 2)}
		if err := e.Add(reqs[i], 0); err != nil {
			return 0, fmt.Errorf("profile: %w", err)
		}
	}
	now := time.Duration(0)
	for !e.Idle() {
		res := e.Step(now, now+time.Hour)
		now = max(res.End, now+1)
	}
	sum := 0.0
	for _, r := range reqs {
		res := r.Result()
		sum += (res.Finished - res.FirstToken).Seconds() / float64(res.OutputTokens-1)
	}
	return sum / float64(n), nil
}
