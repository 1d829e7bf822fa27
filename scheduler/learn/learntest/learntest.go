// Package learntest makes learned-cost shares for tests: what an ingress
// that measured an engine would gossip (learn.StateName).
package learntest

import (
	"bytes"
	"time"

	"github.com/kvmesh/kvmesh/scheduler/learn"
)

// Share returns the share (epoch 1) of a learner at the default config
// that observed 200 prefills of engine, 500 to 12,200 tokens each, taking
// 20 ms + tokens ÷ tokensPerSecond.
func Share(engine string, tokensPerSecond float64) ([]byte, error) {
	lr, err := learn.New(learn.Config{})
	if err != nil {
		return nil, err
	}
	for k := 0; k < 200; k++ {
		tok := 500 + (k*977)%12000
		lr.ObservePrefill(engine, tok, time.Duration((0.02+float64(tok)/tokensPerSecond)*float64(time.Second)))
	}
	own, pooled := lr.Own(nil)
	var buf bytes.Buffer
	if err := learn.EncodeShare(&buf, 1, &pooled, own); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
