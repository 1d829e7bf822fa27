package ratelimit

import (
	"context"
	"log/slog"
	"time"
)

// StateName is the gossip app-state name the limiter's usage travels under.
const StateName = "kvmesh.ratelimit.v1"

// defaultShareInterval is Share's interval when none is given.
const defaultShareInterval = 250 * time.Millisecond

// Carrier is the part of gossip the limiter shares its usage through; *gossip.Node
// satisfies it. SetAppState replaces this node's blob (last writer wins per origin);
// the OnAppState callback runs for every newer blob from another member and must not
// block; OnLeave runs when a member leaves or dies.
type Carrier interface {
	SetAppState(name string, blob []byte) error
	OnAppState(fn func(node, name string, blob []byte))
	OnLeave(fn func(node string))
}

// Share publishes this replica's usage every interval (≤ 0 means 250 ms) and merges
// every other replica's, until ctx is done. Merging happens in the carrier's callback:
// it decodes at most DefaultMaxSize bytes and takes the limiter's lock briefly, so it
// does not block gossip. Run it in a goroutine owned by the ingress.
func (l *Limiter) Share(ctx context.Context, c Carrier, interval time.Duration, log *slog.Logger) {
	if interval <= 0 {
		interval = defaultShareInterval
	}
	l.interval.Store(int64(interval))
	if log == nil {
		log = slog.Default()
	}
	c.OnAppState(func(node, name string, blob []byte) {
		if name != StateName {
			return
		}
		if err := l.MergeState(node, blob); err != nil {
			log.Debug("rate limit state skipped", "node", node, "err", err)
		}
	})
	c.OnLeave(l.ForgetOrigin)
	t := time.NewTicker(interval)
	defer t.Stop()
	var buf []byte
	for {
		buf = l.AppendState(buf[:0], DefaultMaxSize)
		if err := c.SetAppState(StateName, buf); err != nil {
			log.Warn("publish rate limit state", "err", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
