package materialize

import "github.com/kvmesh/kvmesh/kvevents"

// Two live sidecars for one engine are allowed on purpose: the same engine
// id at the same URL is a sidecar restart overlapping its old self. Both
// publish the engine's changes, each in its own epoch, and both answer
// snapshot requests. Taking a snapshot on every delta of an epoch other
// than the current one made the two epochs take turns for ever (a snapshot
// storm: 362 snapshots in 10 s in the fault test). Instead the materializer
// follows one epoch, the newest it knows of, and ignores (and counts) the
// deltas of older ones:
//
//   - Both epochs' starts known (sidecars that send kvevents'
//     Delta.EpochStart): the later start is newer (kvevents.NewerEpoch),
//     the same answer in every ingress.
//   - Otherwise (a sidecar from before the field): one never seen is
//     newer, which is what a plain restart looks like.
//   - Either way, an epoch this engine followed before and gave up (it
//     went silent, or a newer one came) is older: a switch is never undone
//     by the start time of a sidecar that was given up.
//
// So an epoch takes at most one snapshot when it appears. A followed epoch
// whose sidecar has gone while an older one keeps sending is given up after
// Config.EpochGrace of its silence during their deltas (the older is
// followed again), after EpochGrace of its silence since an older one's
// delta that changed the engine's copy (checked by tick: an engine gone
// idle sends no later delta; a live followed sidecar would have published
// that change too), or when only the older one answers a snapshot request.
// Starts are wall-clock times of the sidecars' hosts, so the "older" one may
// be a sidecar restarted with a clock behind its dead predecessor's: it too
// is followed only after EpochGrace (the gossip view, one state per engine,
// does not say that the followed epoch's sidecar is gone).
//
// One exception to "the newest": an epoch whose deltas keep coming while
// gossip lists another epoch for the engine, for OutsideGossipAfter, is
// a sidecar gossip does not know (another installation on the same NATS
// with the same engine id): the epoch gossip lists is followed again at
// its next delta, and not given up for the unlisted one when it goes
// silent (Materializer.unlistedLocked). A restarted sidecar's new epoch is
// listed by gossip within a second or so, long before that.

// epochInfo is what is known of one epoch of an engine.
type epochInfo struct {
	epoch uint64
	start int64 // unix ns; 0: unknown
	lost  bool  // followed before, or lost to the followed epoch
	// left: followed before and given up (setFollow moved away from it).
	// Such an epoch is older whatever the starts say; one that merely
	// lost a snapshot race (a probe the followed epoch answered) is
	// ordered by its start, so a newer sidecar restarted beside an old
	// one is still followed as soon as it is seen.
	left bool
}

// maxOtherEpochs bounds the epochs remembered per engine besides the one
// followed (normally at most one: the sidecar the followed one replaced).
const maxOtherEpochs = 8

// epochView is an engine's followed epoch and the others it has seen.
type epochView struct {
	follow      uint64 // 0: none yet
	followStart int64
	others      []epochInfo
}

// clone is a copy that shares nothing (for a snapshot request in flight).
func (v *epochView) clone() epochView {
	c := *v
	c.others = append([]epochInfo(nil), v.others...)
	return c
}

func (v *epochView) find(ep uint64) *epochInfo {
	for i := range v.others {
		if v.others[i].epoch == ep {
			return &v.others[i]
		}
	}
	return nil
}

// older reports whether epoch ep, started at start (0: unknown), is older
// than the followed one, so its deltas and snapshot replies are not used.
func (v *epochView) older(ep uint64, start int64) bool {
	if v.follow == 0 || ep == v.follow {
		return false
	}
	o := v.find(ep)
	if o != nil && o.left {
		// Followed before and given up: older whatever the starts say. A
		// dead sidecar whose clock ran ahead of its successor's would
		// otherwise stay "newer" for ever, and gossip still showing its
		// head would take a resync every DigestGrace.
		return true
	}
	if start <= 0 && o != nil {
		start = o.start
	}
	if start > 0 && v.followStart > 0 {
		return !kvevents.NewerEpoch(ep, start, v.follow, v.followStart)
	}
	return o != nil && o.lost
}

// startOf is epoch ep's start as known (0: unknown).
func (v *epochView) startOf(ep uint64) int64 {
	if ep == v.follow {
		return v.followStart
	}
	if o := v.find(ep); o != nil {
		return o.start
	}
	return 0
}

// note records what is known of an epoch other than the followed one: its
// start when learned, and that it lost when lost is set.
func (v *epochView) note(ep uint64, start int64, lost bool) {
	if ep == 0 || ep == v.follow {
		return
	}
	o := v.find(ep)
	if o == nil {
		if len(v.others) == maxOtherEpochs {
			v.others = append(v.others[:0], v.others[1:]...) // the longest known goes
		}
		v.others = append(v.others, epochInfo{epoch: ep})
		o = &v.others[len(v.others)-1]
	}
	if start > 0 {
		o.start = start
	}
	o.lost = o.lost || lost
}

// setFollow follows ep from now on; the epoch followed until now has lost.
func (v *epochView) setFollow(ep uint64, start int64) {
	if ep == v.follow {
		if start > 0 {
			v.followStart = start
		}
		return
	}
	prev, prevStart := v.follow, v.followStart
	for i, o := range v.others {
		if o.epoch == ep {
			if start <= 0 {
				start = o.start
			}
			v.others = append(v.others[:i], v.others[i+1:]...)
			break
		}
	}
	v.follow, v.followStart = ep, max(start, 0)
	v.note(prev, prevStart, true)
	if o := v.find(prev); o != nil {
		o.left = true
	}
}
