package gossip

import (
	"context"
	"log"
	"log/slog"
	"strings"
	"sync"
	"time"
)

// mlLog turns memberlist's log lines ("[LEVEL] memberlist: message") into
// records of the node's logger: [ERR] and [WARN] at warn level (a gossip
// key mismatch, a blocked UDP port, failing push/pulls must show at the
// default level), [DEBUG] and [INFO] at debug. memberlist repeats its
// complaints every probe or push/pull, so warn records are limited per
// kind (level and the message's first words, digits dropped): one per
// mlLogEvery, the next one telling how many were suppressed.
type mlLog struct {
	log *slog.Logger
	now func() time.Time

	// mu guards kinds; held only for the map lookup.
	mu    sync.Mutex
	kinds map[string]*mlKind // at most maxMLKinds; beyond, kinds share one
}

type mlKind struct {
	last       time.Time
	suppressed int
}

const (
	mlLogEvery = time.Minute
	maxMLKinds = 64
)

func newMLLogger(l *slog.Logger) *log.Logger {
	return log.New(&mlLog{log: l, now: time.Now, kinds: map[string]*mlKind{}}, "", 0)
}

// Write takes one line (memberlist logs through log.Logger, one Write a line).
func (w *mlLog) Write(p []byte) (int, error) {
	line := strings.TrimRight(string(p), "\n")
	level, msg := slog.LevelDebug, line
	if rest, ok := strings.CutPrefix(line, "["); ok {
		if tag, m, ok := strings.Cut(rest, "] "); ok {
			msg = m
			switch tag {
			case "ERR", "ERROR", "WARN":
				level = slog.LevelWarn
			}
		}
	}
	msg = strings.TrimPrefix(msg, "memberlist: ")
	ctx := context.Background()
	if !w.log.Enabled(ctx, level) {
		return len(p), nil
	}
	if level < slog.LevelWarn {
		w.log.Debug(msg, "from", "memberlist")
		return len(p), nil
	}
	kind := mlKindOf(msg)
	now := w.now()
	w.mu.Lock()
	k := w.kinds[kind]
	if k == nil {
		if len(w.kinds) >= maxMLKinds {
			// Forget kinds quiet for a period (a gone member's push/pull
			// failures), so new ones, a key mismatch above all, keep their
			// own line instead of sharing one.
			for name, old := range w.kinds {
				if old.suppressed == 0 && now.Sub(old.last) >= mlLogEvery {
					delete(w.kinds, name)
				}
			}
		}
		if len(w.kinds) >= maxMLKinds {
			kind = "\x00other"
		}
		if k = w.kinds[kind]; k == nil {
			k = &mlKind{}
			w.kinds[kind] = k
		}
	}
	suppressed := -1
	if k.last.IsZero() || now.Sub(k.last) >= mlLogEvery {
		suppressed, k.suppressed, k.last = k.suppressed, 0, now
	} else {
		k.suppressed++
	}
	w.mu.Unlock()
	switch {
	case suppressed > 0:
		w.log.Warn(msg, "from", "memberlist", "suppressed", suppressed, "per", mlLogEvery)
	case suppressed == 0:
		w.log.Warn(msg, "from", "memberlist")
	}
	return len(p), nil
}

// mlKindOf names a message's kind: its first three words before any ':',
// without digits ("Push/Pull with epp1 failed: ..." is "Push/Pull with epp").
func mlKindOf(msg string) string {
	if i := strings.IndexByte(msg, ':'); i >= 0 {
		msg = msg[:i]
	}
	words := strings.Fields(msg)
	words = words[:min(len(words), 3)]
	return strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' {
			return -1
		}
		return r
	}, strings.Join(words, " "))
}
