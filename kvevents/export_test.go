package kvevents

import "time"

// DrainOut empties s's delivery queue (for the external benchmarks).
func DrainOut(s *Subscriber) {
	for len(s.out) > 0 {
		<-s.out
	}
}

// WithLoopHook returns cfg with hook run on the socket loop at the top of
// every round, before idle probes (hook may block: it holds the loop).
func WithLoopHook(cfg SubscriberConfig, hook func(*Subscriber)) SubscriberConfig {
	cfg.loopHook = hook
	return cfg
}

// PendingInput reports whether rank's SUB socket has a message waiting.
// Call it only on the socket loop (from a loop hook).
func PendingInput(s *Subscriber, rank int) bool { return pendingInput(s.ranks[rank]) }

// AgeLastMsg makes rank's last live message (or probe) age old, as a loop
// held that long would find it. Call it only on the socket loop.
func AgeLastMsg(s *Subscriber, rank int, age time.Duration) {
	s.ranks[rank].lastMsg = time.Now().Add(-age)
}
