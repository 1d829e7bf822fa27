package engine_test

import (
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/sim/engine"
)

// Driving an engine in virtual time: add requests at their arrival times and
// call Step until idle, passing the next arrival as the fusing horizon.
func Example() {
	p, _ := engine.LookupProfile("7b-h100")
	e, _ := engine.New(engine.Config{BlockSize: 16, GPUBlocks: 1024, Profile: p}, nil)
	prompt := make([]uint32, 2000)
	for i := range prompt {
		prompt[i] = uint32(i)
	}
	arrivals := []time.Duration{0, 500 * time.Millisecond} // the same prompt twice
	var reqs []*engine.Request
	now, next := time.Duration(0), 0
	for next < len(arrivals) || !e.Idle() {
		for next < len(arrivals) && arrivals[next] <= now {
			r := &engine.Request{Prompt: prompt, OutputLen: 32}
			_ = e.Add(r, now)
			reqs = append(reqs, r)
			next++
		}
		until := time.Duration(1 << 62)
		if next < len(arrivals) {
			until = arrivals[next]
		}
		res := e.Step(now, until)
		if res.Steps == 0 { // idle: jump to the next arrival
			now = until
			continue
		}
		now = res.End
	}
	for _, r := range reqs {
		res := r.Result()
		fmt.Printf("cached %4d  TTFT %-12v E2E %v\n", res.CachedTokens, res.TTFT.Round(time.Microsecond), res.E2E.Round(time.Microsecond))
	}
	// Output:
	// cached    0  TTFT 72.043ms     E2E 301.798ms
	// cached 1984  TTFT 7.408ms      E2E 237.164ms
}
