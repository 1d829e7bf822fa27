package workload

import (
	"errors"
	"fmt"
	"time"
)

// ErrBadWorkload wraps every invalid workload parameter or trace line.
var ErrBadWorkload = errors.New("workload: invalid")

// Request is one request of a workload.
type Request struct {
	ID int
	// Arrival is the offset from the start of the run.
	Arrival time.Duration
	// PromptTokens is the prompt length; AppendPrompt produces exactly
	// that many tokens.
	PromptTokens int
	// OutputTokens is how many tokens to generate, at least 1.
	OutputTokens int
	// ZeroOutput marks a trace row that asked for 0 output tokens (Azure's
	// and BurstGPT's failed requests): it generates 1, as an engine
	// always samples one token, and reports count it (Stats.ZeroOutput).
	ZeroOutput bool
	// Group is the shared-prefix group (or -1 when the trace has none);
	// Session is a stable session id string for session affinity.
	Group   int
	Session string
	// After, when > 0, makes the request a closed-loop follow-up, as
	// aiperf replays a session's next turn: it is sent Think after request
	// After−1 (an earlier request of the same workload) has finished or
	// failed. Arrival is then the open-loop estimate (request After−1's
	// Arrival + Think) that orders the workload; the discrete-event runs
	// and loadtest/loadgen honour After, the autoscaling runs (which
	// generate their own workloads) do not.
	After int
	Think time.Duration

	src promptSource
	qid uint64 // shared-prefix question id
}

// FollowUps lists the requests' closed-loop follow-ups (Request.After):
// first[i] is request i's first follow-up and next[j] the next follow-up
// of j's predecessor, -1 for none; nil, nil when no request has After. A
// request that follows itself or a later one is an error.
func FollowUps(reqs []Request) (first, next []int, err error) {
	for j := range reqs {
		a := reqs[j].After - 1
		if a < 0 {
			continue
		}
		if a >= j {
			return nil, nil, fmt.Errorf("%w: request %d follows request %d, not an earlier one", ErrBadWorkload, j, a)
		}
		if first == nil {
			first, next = make([]int, len(reqs)), make([]int, len(reqs))
			for i := range first {
				first[i], next[i] = -1, -1
			}
		}
		next[j], first[a] = first[a], j
	}
	return first, next, nil
}

// promptSource produces a request's prompt.
type promptSource interface {
	appendPrompt(dst []uint32, r *Request) []uint32
}

// AppendPrompt appends the request's prompt token ids to dst.
func (r *Request) AppendPrompt(dst []uint32) []uint32 {
	if r.src == nil {
		return dst
	}
	return r.src.appendPrompt(dst, r)
}

// Prompt returns the prompt as a new slice.
func (r *Request) Prompt() []uint32 { return r.AppendPrompt(make([]uint32, 0, r.PromptTokens)) }

// Vocab bounds generated token ids: [TokenBase, TokenBase+TokenRange).
// Inside every common vocabulary and clear of special tokens.
const (
	TokenBase  = 1000
	TokenRange = 30000
)

// token is the i-th token of the block stream identified by id.
func token(seed, id uint64, i int) uint32 {
	x := seed ^ id*0x9E3779B97F4A7C15 ^ uint64(i)*0xD1B54A32D192ED03
	x ^= x >> 30
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 27
	x *= 0x94D049BB133111EB
	x ^= x >> 31
	return TokenBase + uint32(x%TokenRange)
}

// Stats summarises a workload.
type Stats struct {
	Requests     int
	PromptTokens int
	OutputTokens int
	Duration     time.Duration // last arrival
	// ZeroOutput counts the trace rows that asked for 0 output tokens,
	// sent as 1 (Request.ZeroOutput).
	ZeroOutput int
}

// Summarize computes Stats.
func Summarize(reqs []Request) Stats {
	var s Stats
	s.Requests = len(reqs)
	for i := range reqs {
		s.PromptTokens += reqs[i].PromptTokens
		s.OutputTokens += reqs[i].OutputTokens
		s.Duration = max(s.Duration, reqs[i].Arrival)
		if reqs[i].ZeroOutput {
			s.ZeroOutput++
		}
	}
	return s
}
