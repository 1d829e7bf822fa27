package ingress

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/vmihailenco/msgpack/v5"

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
// Wire (msgpack, arrays only): [1, epoch, pooled, [[engine id, stats], …]]
// where stats is the 14 sums of learn.Stats, prefill's five then decode's
// nine, and epoch is random per learner: a replica restarted under the same
// name starts a new epoch, and its peers drop what the old one shared
// rather than keep engines the new one has not measured yet.
// A blob holds at most learnShareMaxBlob bytes; when not every engine fits,
// the engines with the most samples since they were last sent go first
// (then the longest unsent), so a large cluster's engines take turns.

// LearnStateName is the gossip app-state key of a replica's learned sums.
const LearnStateName = "kvmesh.learn.v1"

const (
	learnShareInterval = 5 * time.Second
	// learnShareMaxBlob keeps a share well under gossip's 4 KiB app limit.
	learnShareMaxBlob = 3 << 10
	learnWireVersion  = 1
	learnStatsLen     = 5 + 9
	// maxLearnID bounds an engine id on the wire (gossip engine ids are
	// DNS-label-like; 253 is a DNS name's limit).
	maxLearnID = 253
)

var errLearnWire = errors.New("learned-cost share: malformed")

// learnShare is one decoded share.
type learnShare struct {
	epoch   uint64
	pooled  learn.Stats
	engines []learn.EngineStats
}

// learnStatsBound is the most bytes one engine's entry takes: array
// headers, the id's string header and bytes, 14 float64s.
func learnStatsBound(id string) int { return 1 + 5 + len(id) + 3 + learnStatsLen*9 }

func encodeLearnStats(e *msgpack.Encoder, s *learn.Stats) error {
	if err := e.EncodeArrayLen(learnStatsLen); err != nil {
		return err
	}
	for _, v := range s.Prefill {
		if err := e.EncodeFloat64(v); err != nil {
			return err
		}
	}
	for _, v := range s.Decode {
		if err := e.EncodeFloat64(v); err != nil {
			return err
		}
	}
	return nil
}

// encodeLearnShare writes a share of pooled and engines into buf.
func encodeLearnShare(buf *bytes.Buffer, epoch uint64, pooled *learn.Stats, engines []learn.EngineStats) error {
	buf.Reset()
	e := msgpack.NewEncoder(buf)
	e.UseCompactFloats(true) // a sum that is exactly a float32 (0, small counts) takes 5 bytes
	if err := e.EncodeArrayLen(4); err != nil {
		return err
	}
	if err := e.EncodeInt(learnWireVersion); err != nil {
		return err
	}
	if err := e.EncodeUint(epoch); err != nil {
		return err
	}
	if err := encodeLearnStats(e, pooled); err != nil {
		return err
	}
	if err := e.EncodeArrayLen(len(engines)); err != nil {
		return err
	}
	for i := range engines {
		if err := e.EncodeArrayLen(2); err != nil {
			return err
		}
		if err := e.EncodeString(engines[i].Engine); err != nil {
			return err
		}
		if err := encodeLearnStats(e, &engines[i].Stats); err != nil {
			return err
		}
	}
	return nil
}

// decodeLearnShare parses a share. It checks the shape and bounds only;
// the sums' plausibility is learn.Stats.Check's (SetPeer runs it).
func decodeLearnShare(b []byte) (learnShare, error) {
	var sh learnShare
	r := bytes.NewReader(b)
	d := msgpack.NewDecoder(r)
	arr := func(want int) error {
		n, err := d.DecodeArrayLen()
		if err != nil {
			return fmt.Errorf("%w: %v", errLearnWire, err)
		}
		if n != want {
			return fmt.Errorf("%w: array of %d, want %d", errLearnWire, n, want)
		}
		return nil
	}
	stats := func(s *learn.Stats) error {
		if err := arr(learnStatsLen); err != nil {
			return err
		}
		for i := range learnStatsLen {
			v, err := d.DecodeFloat64()
			if err != nil {
				return fmt.Errorf("%w: %v", errLearnWire, err)
			}
			if i < len(s.Prefill) {
				s.Prefill[i] = v
			} else {
				s.Decode[i-len(s.Prefill)] = v
			}
		}
		return nil
	}
	if err := arr(4); err != nil {
		return sh, err
	}
	v, err := d.DecodeInt()
	if err != nil {
		return sh, fmt.Errorf("%w: version: %v", errLearnWire, err)
	}
	if v != learnWireVersion {
		return sh, fmt.Errorf("%w: version %d, want %d", errLearnWire, v, learnWireVersion)
	}
	if sh.epoch, err = d.DecodeUint64(); err != nil {
		return sh, fmt.Errorf("%w: epoch: %v", errLearnWire, err)
	}
	if err := stats(&sh.pooled); err != nil {
		return sh, err
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return sh, fmt.Errorf("%w: %v", errLearnWire, err)
	}
	// Each entry takes more than 16 bytes: a count beyond that is a lie
	// that would make us allocate for it.
	if n < 0 || n > len(b)/16 {
		return sh, fmt.Errorf("%w: %d engines in %d bytes", errLearnWire, n, len(b))
	}
	sh.engines = make([]learn.EngineStats, n)
	for i := range sh.engines {
		es := &sh.engines[i]
		if err := arr(2); err != nil {
			return sh, err
		}
		if es.Engine, err = d.DecodeString(); err != nil {
			return sh, fmt.Errorf("%w: engine id: %v", errLearnWire, err)
		}
		if es.Engine == "" || len(es.Engine) > maxLearnID {
			return sh, fmt.Errorf("%w: engine id of %d bytes", errLearnWire, len(es.Engine))
		}
		if err := stats(&es.Stats); err != nil {
			return sh, err
		}
	}
	if r.Len() != 0 {
		return sh, fmt.Errorf("%w: %d trailing bytes", errLearnWire, r.Len())
	}
	return sh, nil
}

// learnSharer publishes this replica's own sums; the load loop owns it.
type learnSharer struct {
	epoch  uint64 // random, drawn at the first share
	last   time.Time
	tick   uint64
	sent   map[string]learnSent // by engine (the learner keeps every engine it saw, so does this)
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
	gain := func(e *learn.EngineStats) uint64 { return e.Samples - ls.sent[e.Engine].samples }
	slices.SortStableFunc(ls.own, func(a, b learn.EngineStats) int {
		if c := cmp.Compare(gain(&b), gain(&a)); c != 0 {
			return c
		}
		return cmp.Compare(ls.sent[a.Engine].tick, ls.sent[b.Engine].tick)
	})
	room := learnShareMaxBlob - 17 - learnStatsLen*9 // the header, epoch and pooled sums
	ls.picked = ls.picked[:0]
	for i := range ls.own {
		e := &ls.own[i]
		if room -= learnStatsBound(e.Engine); room < 0 {
			break
		}
		ls.picked = append(ls.picked, *e)
		ls.sent[e.Engine] = learnSent{samples: e.Samples, tick: ls.tick}
	}
	if err := encodeLearnShare(&ls.buf, ls.epoch, &pooled, ls.picked); err != nil {
		return nil, err
	}
	return ls.buf.Bytes(), nil
}

// learnGossipMetrics counts peers' shares by result, and holds each
// peer's epoch.
type learnGossipMetrics struct {
	shares *prometheus.CounterVec // result: accepted, rejected, partial
	mu     sync.Mutex
	epochs map[string]uint64 // by peer: its learner's epoch
}

// newEpoch records peer's epoch and reports whether it differs from the
// one seen before (a first share is not a new epoch).
func (m *learnGossipMetrics) newEpoch(peer string, epoch uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, seen := m.epochs[peer]
	m.epochs[peer] = epoch
	return seen && old != epoch
}

// forget drops peer's epoch (it left).
func (m *learnGossipMetrics) forget(peer string) {
	m.mu.Lock()
	delete(m.epochs, peer)
	m.mu.Unlock()
}

func newLearnGossipMetrics(reg prometheus.Registerer, id string) *learnGossipMetrics {
	m := &learnGossipMetrics{epochs: make(map[string]uint64), shares: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "kvmesh_ingress_learn_shares_total",
		Help:        "Learned-cost shares received from other replicas by gossip: accepted; rejected (malformed, or implausible pooled sums: none of it is used); partial (the implausible engines dropped, the rest used).",
		ConstLabels: prometheus.Labels{"ingress": id}}, []string{"result"})}
	if err := reg.Register(m.shares); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			m.shares = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return m
}

// mergeLearnShare hands a peer's share to the learner (on a memberlist
// goroutine: decoding and a brief lock, no I/O). A share that does not
// parse or whose pooled sums are implausible is dropped whole ("rejected");
// one with some implausible engines keeps the others ("partial").
func (s *Server) mergeLearnShare(origin string, blob []byte) {
	result := "accepted"
	sh, err := decodeLearnShare(blob)
	if err == nil {
		err = sh.pooled.Check()
	}
	if err != nil {
		result = "rejected"
	} else {
		if s.learnGossip.newEpoch(origin, sh.epoch) {
			s.learn.ForgetPeer(origin) // restarted: what the old learner shared goes
		}
		if err = s.learn.SetPeer(origin, sh.pooled, sh.engines); err != nil {
			result = "partial"
		}
	}
	s.learnGossip.shares.WithLabelValues(result).Inc()
	if err != nil {
		s.log.Debug("bad learned-cost share", "from", origin, "result", result, "err", err)
	}
}
