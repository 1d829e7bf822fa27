package materialize

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/kvevents"
)

// A sidecar restarted on a host whose clock is behind its dead
// predecessor's is followed once the dead one stays silent, but gossip may
// still show the dead epoch's head (an entry that outlives its sidecar).
// That epoch lost: it is older now, whatever the start times say, and its
// head is no reason to resync. It was not: every DigestGrace the
// materializer took a "behind gossip head" snapshot, answered by the live
// sidecar, for as long as the engine stayed idle (a black-box test saw 1.5
// snapshots a second for over five minutes, nothing logged).
func TestLostEpochInGossipTakesNoSnapshots(t *testing.T) {
	m, _ := newUnrunMaterializer(t, func(*Config) {})
	const dead, live = 0xdead, 0x11fe
	deadStart := time.Now().Add(5 * time.Minute).UnixNano() // the dead sidecar's clock was ahead
	liveStart := time.Now().UnixNano()
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	e := m.engine("e", "m")
	e.epochs.setFollow(dead, deadStart)
	e.epoch, e.seq, e.synced = dead, 100, true
	// The dead one went silent: the live one is followed and installed.
	m.followLocked(e, live, liveStart, now)
	e.retryAt = time.Time{}
	e.epoch, e.seq, e.synced = live, 3, true
	e.lastMsg = now

	g := kvevents.EngineDigest{Head: kvevents.Head{Epoch: dead, Seq: 100}}
	for i := range 10 {
		m.checkHeadLocked(e, g, now.Add(time.Duration(i+1)*m.cfg.DigestGrace))
	}
	if n := testutil.ToFloat64(m.met.gaps); n != 0 || !e.retryAt.IsZero() {
		t.Fatalf("gossip showing the lost epoch's head: %v resyncs, snapshot due %v; want none", n, !e.retryAt.IsZero())
	}
	// A head of the followed epoch ahead of the copy still resyncs.
	g.Head = kvevents.Head{Epoch: live, Seq: 9}
	m.checkHeadLocked(e, g, now.Add(20*m.cfg.DigestGrace))
	m.checkHeadLocked(e, g, now.Add(22*m.cfg.DigestGrace))
	if n := testutil.ToFloat64(m.met.gaps); n != 1 || e.retryAt.IsZero() {
		t.Fatalf("gossip ahead in the followed epoch: %v resyncs, snapshot due %v; want 1 and true", n, !e.retryAt.IsZero())
	}
}

// An epoch that only lost a snapshot race is ordered by its start: a newer
// sidecar restarted beside an old one on an idle engine, whose gossiped
// head made a probe the old one answered first, must still be newer when
// its deltas come (else it would be ignored until the old one went
// silent, and ingresses that saw the race differently would disagree).
// Only an epoch followed before and given up is older whatever its start.
func TestEpochThatLostAProbeStillOrdersByStart(t *testing.T) {
	var v epochView
	v.setFollow(0xa, 100)
	v.note(0xb, 0, true) // probed for, answered by 0xa
	if v.older(0xb, 200) {
		t.Fatal("an epoch started later, which only lost a probe, counts as older")
	}
	if !v.older(0xc, 50) {
		t.Fatal("an epoch started earlier counts as newer")
	}
	v.setFollow(0xb, 200) // followed now; 0xa given up
	if !v.older(0xa, 0) || !v.older(0xa, 300) {
		t.Fatal("the epoch given up is not older")
	}
}
