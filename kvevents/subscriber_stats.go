package kvevents

import "sync/atomic"

// subscriberCounters are written by the socket loop and read by anyone.
type subscriberCounters struct {
	received, delivered, gaps, replays, replayed, replayFailures atomic.Uint64
	resets, lost, decodeErrors, malformed, duplicates, probes    atomic.Uint64
	unknownEvents                                                atomic.Uint64
}

func (c *subscriberCounters) snapshot() SubscriberStats {
	return SubscriberStats{
		Received:       c.received.Load(),
		Delivered:      c.delivered.Load(),
		Gaps:           c.gaps.Load(),
		Replays:        c.replays.Load(),
		Replayed:       c.replayed.Load(),
		ReplayFailures: c.replayFailures.Load(),
		Resets:         c.resets.Load(),
		LostHistory:    c.lost.Load(),
		DecodeErrors:   c.decodeErrors.Load(),
		Malformed:      c.malformed.Load(),
		Duplicates:     c.duplicates.Load(),
		Probes:         c.probes.Load(),
		UnknownEvents:  c.unknownEvents.Load(),
	}
}
