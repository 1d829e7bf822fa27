package kvevents

// DrainOut empties s's delivery queue (for the external benchmarks).
func DrainOut(s *Subscriber) {
	for len(s.out) > 0 {
		<-s.out
	}
}
