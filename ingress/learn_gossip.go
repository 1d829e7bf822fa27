package ingress

import (
	"bytes"
	"cmp"
	"errors"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/scheduler/learn"
)

// Learned costs shared by gossip (docs/OPERATIONS.md, "Learned costs
// (online)"): every replica publishes the sums its own learner has
// gathered (learn.Stats: the normal equations of each engine's two lines,
// and of the pooled ones) as an App entry under LearnStateName, and adds
// each peer's latest sums to its own when it fits (learn.Learner.SetPeer).
// With N replicas behind a load balancer each one sees 1/N of the traffic;
// sharing gives every replica the fit over all of it, and an engine a
// replica has not sent to yet is priced with what the others measured.
//
// The wire form is learn.EncodeShare's. Its epoch is random per learner: a
// replica restarted under the same name starts a new epoch, and its peers
// drop what the old one shared rather than keep engines the new one has
// not measured yet.
// A blob holds at most learn.MaxShareBytes; when not every engine fits,
// the engines with the most samples since they were last sent go first
// (then the longest unsent), so a large cluster's engines take turns.

// LearnStateName is the gossip app-state key of a replica's learned sums.
const LearnStateName = learn.StateName

const learnShareInterval = 5 * time.Second

// learnSharer publishes this replica's own sums; the load loop owns it.
type learnSharer struct {
	epoch  uint64 // random, drawn at the first share
	last   time.Time
	tick   uint64
	sent   map[string]learnSent // by engine: the learner's own (an engine it forgot leaves at the next share)
	own    []learn.EngineStats
	picked []learn.EngineStats
	buf    bytes.Buffer
}

// learnSent is an engine's samples and tick when its sums were last sent.
type learnSent struct {
	samples uint64
	tick    uint64
}

// share returns the next blob to publish, nil when the interval has not
// passed or there is nothing learned yet.
func (ls *learnSharer) share(now time.Time, lr *learn.Learner) ([]byte, error) {
	if !ls.last.IsZero() && now.Sub(ls.last) < learnShareInterval {
		return nil, nil
	}
	var pooled learn.Stats
	ls.own, pooled = lr.Own(ls.own[:0])
	if pooled.Prefill[0] == 0 && pooled.Decode[0] == 0 {
		return nil, nil // nothing measured yet: share as soon as there is
	}
	ls.last = now
	ls.tick++
	for ls.epoch == 0 {
		ls.epoch = rand.Uint64()
	}
	if ls.sent == nil {
		ls.sent = make(map[string]learnSent)
	}
	for id := range ls.sent { // ls.own is sorted by engine (learn.Learner.Own)
		if _, ok := slices.BinarySearchFunc(ls.own, id, func(e learn.EngineStats, id string) int { return cmp.Compare(e.Engine, id) }); !ok {
			delete(ls.sent, id) // forgotten by the learner (forget.go)
		}
	}
	gain := func(e *learn.EngineStats) uint64 { return e.Samples - ls.sent[e.Engine].samples }
	slices.SortStableFunc(ls.own, func(a, b learn.EngineStats) int {
		if c := cmp.Compare(gain(&b), gain(&a)); c != 0 {
			return c
		}
		return cmp.Compare(ls.sent[a.Engine].tick, ls.sent[b.Engine].tick)
	})
	room := learn.MaxShareBytes - learn.HeaderBytes
	ls.picked = ls.picked[:0]
	for i := range ls.own {
		e := &ls.own[i]
		if room -= learn.EntryBytes(e.Engine); room < 0 {
			break
		}
		ls.picked = append(ls.picked, *e)
		ls.sent[e.Engine] = learnSent{samples: e.Samples, tick: ls.tick}
	}
	if err := learn.EncodeShare(&ls.buf, ls.epoch, &pooled, ls.picked); err != nil {
		return nil, err
	}
	return ls.buf.Bytes(), nil
}

// newLearnShares is the counter of peers' shares by result.
func newLearnShares(reg prometheus.Registerer, id string) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "kvmesh_ingress_learn_shares_total",
		Help:        "Learned-cost shares received from other replicas by gossip: accepted; rejected (malformed, or implausible pooled sums: none of it is used); partial (the implausible engines dropped, the rest used).",
		ConstLabels: prometheus.Labels{"ingress": id}}, []string{"result"})
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			c = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return c
}

// mergeLearnShare hands a peer's share to the learner (on a memberlist
// goroutine: decoding and a brief lock, no I/O). A share that does not
// parse, or that the learner refuses whole (learn.ErrRefused: implausible
// pooled sums), is "rejected"; one with some implausible engines keeps the
// others ("partial"). A share under a new epoch replaces what the peer's
// old learner shared (learn.Learner.SetShare).
func (s *Server) mergeLearnShare(origin string, blob []byte) {
	result := "accepted"
	sh, err := learn.DecodeShare(blob)
	if err == nil {
		err = s.learn.SetShare(origin, &sh)
	}
	switch {
	case err == nil:
	case errors.Is(err, learn.ErrWire) || errors.Is(err, learn.ErrRefused):
		result = "rejected"
	default:
		result = "partial"
	}
	s.learnShares.WithLabelValues(result).Inc()
	if err != nil {
		s.log.Debug("bad learned-cost share", "from", origin, "result", result, "err", err)
	}
}
