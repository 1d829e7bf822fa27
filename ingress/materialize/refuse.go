package materialize

import (
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// MaxEpochAhead bounds how far ahead of this host's clock a delta's or a
// snapshot reply's epoch start (its sidecar's wall clock) may be. Of two
// epochs of an engine the later start is followed (epoch.go), so a start
// far in the future would make every real epoch of the engine, its
// restarts included, look older and its deltas be ignored for as long as
// the forged one keeps publishing, and win every race against them until
// that time. It is the state lane's bound (gossip.MaxRelayAhead, 5 min,
// docs/SECURITY.md) and for the same reason: room for clock skew between
// hosts, while such a forgery is refused. A sidecar whose clock is that far
// ahead of this host's is refused too: its engine has no keys in this
// ingress's index (cache misses, never wrong answers), counted and warned
// about once a minute with the skew, as on the state lane.
const MaxEpochAhead = gossip.MaxRelayAhead

// Reasons of kvmesh_materializer_refused_total.
const (
	refusedDeltaSubject    = "delta_subject"
	refusedDeltaEpochAhead = "delta_epoch_ahead"
	refusedSnapSubject     = "snapshot_subject"
	refusedSnapEpochAhead  = "snapshot_epoch_ahead"
	// refusedWarnEvery spaces the warnings of one reason.
	refusedWarnEvery = time.Minute
)

var refusalReasons = []string{refusedDeltaSubject, refusedDeltaEpochAhead, refusedSnapSubject, refusedSnapEpochAhead}

// deltaRefusal is why d, delivered on subject at now, must not be used
// ("": it may). The subject is the publisher's NATS permission, so it is
// what binds the body: a delta whose engine or model is not the one its
// subject names (natsutil.DeltaSubject, as every sidecar builds it) is a
// forged or misbehaving publisher's, and taking it would let any user
// allowed one delta subject write every engine's index entry.
func deltaRefusal(subj *natsutil.Subjects, subject string, d *kvevents.Delta, now time.Time) string {
	if !subj.IsDeltaSubject(subject, d.Model, d.Engine) {
		return refusedDeltaSubject
	}
	if epochAhead(d.EpochStart, now) {
		return refusedDeltaEpochAhead
	}
	return ""
}

// chunkRefusal is why snapshot chunk c, a reply to the request for engine
// of model, must not be used ("": it may). Replies come on the request's
// own inbox, which only a subscriber of the engine's snapshot subject
// learns: a chunk naming another engine or model than that subject is not
// its sidecar's.
func chunkRefusal(model, engine string, c *kvevents.SnapshotChunk, now time.Time) string {
	if c.Engine != engine || c.Model != model {
		return refusedSnapSubject
	}
	if epochAhead(c.EpochStart, now) {
		return refusedSnapEpochAhead
	}
	return ""
}

// epochAhead reports whether an epoch start (unix ns; 0: unknown) is more
// than MaxEpochAhead past now.
func epochAhead(start int64, now time.Time) bool {
	return start > now.Add(MaxEpochAhead).UnixNano()
}

// refuse counts one refusal, and logs it at most once a minute per reason
// (a forging publisher must not flood the log): with the engine and subject
// it named, and for an epoch start ahead, how far. Safe for concurrent use
// (snapshot workers call it too).
func (m *Materializer) refuse(reason, subject, engine, model string, start int64, now time.Time) {
	m.met.refused.WithLabelValues(reason).Inc()
	m.warnMu.Lock()
	due := now.Sub(m.refusedWarned[reason]) >= refusedWarnEvery
	if due {
		m.refusedWarned[reason] = now
	}
	m.warnMu.Unlock()
	if !due {
		return
	}
	switch reason {
	case refusedDeltaSubject, refusedSnapSubject:
		m.log.Warn("refusing a delta or snapshot reply whose engine or model is not the one its subject names: a misbehaving or forged publisher (restrict who may publish on "+m.cfg.Subjects.DeltaWildcard()+" and answer "+m.cfg.Subjects.Prefix()+".snap.>, docs/SECURITY.md)",
			"reason", reason, "subject", subject, "engine", engine, "model", model, "per", refusedWarnEvery)
	default:
		m.log.Warn("refusing a delta or snapshot reply whose sidecar epoch starts too far ahead of this clock: clock skew between the hosts (fix the clocks, NTP) or a forged publisher",
			"reason", reason, "subject", subject, "engine", engine, "model", model,
			"ahead", time.Duration(start-now.UnixNano()).Round(time.Second), "max_ahead", MaxEpochAhead, "per", refusedWarnEvery)
	}
}
