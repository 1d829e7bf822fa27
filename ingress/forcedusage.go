package ingress

import (
	"bytes"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// A streamed completion or chat request that sets no stream_options goes
// upstream with "stream_options":{"include_usage":true} added, so the
// ingress counts output tokens exactly (metrics, token limits, the access
// log, the prompt token check), and the usage chunk it asked for is kept
// from the client (dropUsageEvents, proxystream.go).
//
// vLLM run with --enable-force-include-usage sends that chunk even when the
// client did not ask for it (should_include_usage: a stream without
// stream_options gets it; so does one with include_usage false). A client
// of such an engine expects it, so the ingress passes it when the model's
// engines send it unasked. It learns that per model, by probing: about once
// per forcedUsageEvery, one streamed request that sets no stream_options
// goes upstream as the client wrote it (its output tokens counted one per
// event instead of from the usage), and its stream says whether the
// engine sent the chunk anyway. The engines of one model are taken to run
// with the same flags (one deployment). Until a probe has answered, the
// chunk is dropped, as it always was.

// forcedUsageEvery is how often a model's engines are probed again (a
// restart may change their flags); forcedUsageRetry is how soon a probe
// that ended with no verdict (a failed or abandoned stream) is retried.
const (
	forcedUsageEvery = 10 * time.Minute
	forcedUsageRetry = 30 * time.Second
)

const (
	usageUnknown int32 = iota // no probe has answered
	usageAsked                // the engines send usage only when asked
	usageForced               // the engines send usage unasked
)

// forcedUsage is every model's state. Lock rule: mu guards the map only;
// a state's fields are atomics, read and written without it.
type forcedUsage struct {
	mu     sync.RWMutex
	models map[string]*usageState
}

type usageState struct {
	verdict atomic.Int32 // usageUnknown, usageAsked or usageForced
	probeAt atomic.Int64 // monotime reading of when the last probe was claimed
}

func (f *forcedUsage) state(model string) *usageState {
	f.mu.RLock()
	st := f.models[model]
	f.mu.RUnlock()
	if st != nil {
		return st
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if st = f.models[model]; st == nil {
		if f.models == nil {
			f.models = map[string]*usageState{}
		}
		st = new(usageState)
		f.models[model] = st
	}
	return st
}

// claimProbe reports whether this request is the model's probe: its stream
// goes upstream without the ingress's include_usage.
func (st *usageState) claimProbe(now time.Time) bool {
	last := st.probeAt.Load()
	wait := forcedUsageEvery
	if st.verdict.Load() == usageUnknown {
		wait = forcedUsageRetry
	}
	return (last == 0 || monotime.Of(now)-last >= int64(wait)) && st.probeAt.CompareAndSwap(last, monotime.Of(now))
}

// planUsage decides, for a streamed completions or chat request that set no
// stream_options, whether the ingress adds include_usage (add) and whether
// the usage chunk is then kept from the client (c.dropUsage), or the
// request is the model's probe (c.usage set: neither).
func (c *call) planUsage() (add bool) {
	st := c.s.forced.state(c.model)
	if st.claimProbe(time.Now()) {
		c.usage = st
		return false
	}
	c.usage = nil
	c.dropUsage = st.verdict.Load() != usageForced
	return true
}

// probeUsage records the probe's verdict from its stream's events: a
// usage chunk means the engines send it unasked; [DONE] (sawDone) with
// none before it means they do not.
func (p *proxyStream) probeUsage(events []byte, sawDone bool) {
	c := p.c
	if c.usage == nil {
		return
	}
	switch {
	case hasUsageOnly(events) && bytes.Contains(events, usageMarker):
		c.usage.verdict.Store(usageForced)
	case sawDone:
		c.usage.verdict.Store(usageAsked)
	default:
		return
	}
	c.usage = nil
}
