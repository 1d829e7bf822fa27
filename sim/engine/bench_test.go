package engine

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

type countSink struct{ n int }

func (s *countSink) KVEvents(_ time.Duration, evs []kvevents.Event) { s.n += len(evs) }

// benchWorkload keeps `batch` requests in flight on one engine: shared
// 512-token system prompts in 8 groups, 64-token questions, 128 output tokens.
// It reports engine steps and wall time per simulated step.
func benchWorkload(b *testing.B, batch, fused int) { benchWorkloadBlocks(b, batch, fused, 8192) }

func benchWorkloadBlocks(b *testing.B, batch, fused, blocks int) {
	sink := &countSink{}
	e, err := New(Config{GPUBlocks: blocks, MaxFusedSteps: fused, Profile: profiles["7b-h100"]}, sink)
	if err != nil {
		b.Fatal(err)
	}
	prompts := make([][]uint32, 64)
	for i := range prompts {
		p := make([]uint32, 576)
		for j := range p {
			if j < 512 {
				p[j] = uint32(1 + (i%8)*1000 + j)
			} else {
				p[j] = uint32(100000 + i*100 + j)
			}
		}
		prompts[i] = p
	}
	now, next := time.Duration(0), 0
	add := func() {
		r := &Request{Prompt: prompts[next%len(prompts)], OutputLen: 128}
		next++
		if err := e.Add(r, now); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < batch; i++ {
		add()
	}
	b.ReportAllocs()
	b.ResetTimer()
	steps := 0
	for steps < b.N {
		res := e.Step(now, now+time.Hour)
		steps += res.Steps
		now = res.End
		for range res.Finished {
			add() // closed loop: a new request per finished one
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(steps), "ns/step")
	b.ReportMetric(float64(now)/float64(time.Second)/b.Elapsed().Seconds(), "sim-s/s")
}

func BenchmarkStepBatch64Single(b *testing.B) { benchWorkload(b, 64, 1) }
func BenchmarkStepBatch64Fused(b *testing.B)  { benchWorkload(b, 64, 64) }
func BenchmarkStepBatch8Fused(b *testing.B)   { benchWorkload(b, 8, 64) }

// KV-bound: 256 requests in flight on 1,024 blocks (16k tokens), so most
// wait for blocks; fusing still applies while the queue head cannot fit.
func BenchmarkStepKVBoundSingle(b *testing.B) { benchWorkloadBlocks(b, 256, 1, 1024) }
func BenchmarkStepKVBoundFused(b *testing.B)  { benchWorkloadBlocks(b, 256, 64, 1024) }

// BenchmarkDecodeStepNoAlloc proves a steady decode step (batch 32, events
// on) allocates nothing; requests are added only when one finishes.
func BenchmarkDecodeStepNoAlloc(b *testing.B) {
	e, _ := New(Config{GPUBlocks: 1 << 14, MaxFusedSteps: 1, Profile: profiles["7b-h100"]}, &countSink{})
	reqs := make([]Request, 0, 1024)
	add := func(now time.Duration) {
		if len(reqs) == cap(reqs) {
			reqs = reqs[:0]
		}
		reqs = append(reqs, Request{Prompt: seq(len(reqs)*1000+1, 100), OutputLen: 4000})
		if err := e.Add(&reqs[len(reqs)-1], now); err != nil {
			b.Fatal(err)
		}
	}
	for i := 0; i < 32; i++ {
		add(0)
	}
	now := e.Step(0, 0).End
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		res := e.Step(now, now)
		now = res.End
		for range res.Finished {
			add(now)
		}
	}
}
