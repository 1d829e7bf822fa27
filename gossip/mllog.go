package gossip

import (
	"context"
	"encoding/json"
	"log"
	"log/slog"
	"strconv"
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
//
// Two kinds of [ERR]/[WARN] line are what a restart looks like, not a
// fault, and are logged lower (mlLevel): a member restarted under its old
// name (a fixed --id) refutes, while it starts, the dead, suspect or (its
// previous run killed, not left) alive state that run left in the cluster;
// and a node that is stopping has its own sockets closed under
// memberlist's last sends and reads (and its dials cancelled: transport.go
// ends them with the node). The metadata memberlist prints as decimal byte
// lists in a refuted alive message is rewritten as its JSON text.
type mlLog struct {
	log *slog.Logger
	now func() time.Time
	// started is when the node started: refutations within
	// mlRefuteGrace of it are about the previous run.
	started time.Time
	// stopped is closed once the node stops (nil: never).
	stopped <-chan struct{}

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
	// mlRefuteGrace covers the join's push/pull and the retransmissions
	// of the previous run's dead or suspect message (a few gossip
	// intervals per member); a refutation later means the running member
	// was declared suspect or dead: a real problem, logged at warn.
	mlRefuteGrace = time.Minute
)

// newMLLogger returns memberlist's logger for a node started now whose
// stop closes stopped.
func newMLLogger(l *slog.Logger, stopped <-chan struct{}) *log.Logger {
	return log.New(&mlLog{log: l, now: time.Now, started: time.Now(), stopped: stopped, kinds: map[string]*mlKind{}}, "", 0)
}

// memberlist's texts (v0.7.0, state.go and net.go) of the restart noise.
const (
	mlRefuteDead    = "Refuting a dead message"
	mlRefuteSuspect = "Refuting a suspect message"
	// mlRefuteAlive is followed by "for '%s' (%v:%d) meta:(%v VS %v),
	// vsn:(%v VS %v)": the refuted message's metadata, then this node's.
	mlRefuteAlive  = "Refuting an alive message"
	mlClosedConn   = "use of closed network connection" // net.ErrClosed: a socket this process closed
	mlDialCanceled = "operation was canceled"           // a dial of transport.go's, cancelled by the node's stop
)

// mlLevel is the level of a memberlist line tagged at level: the restart
// noise described at mlLog lower, everything else as tagged. previous says
// the line refutes an alive message of this member's previous run
// (refutedAlive): at info within the start grace. Any other refuted alive
// message, or one after the grace (the other process keeps claiming the
// name: a duplicate --id), stays at warn.
func (w *mlLog) mlLevel(level slog.Level, msg string, previous bool) slog.Level {
	if level < slog.LevelWarn {
		return level
	}
	inGrace := w.now().Sub(w.started) < mlRefuteGrace
	if (strings.HasPrefix(msg, mlRefuteDead) || strings.HasPrefix(msg, mlRefuteSuspect) || previous) && inGrace {
		return slog.LevelInfo
	}
	if (strings.Contains(msg, mlClosedConn) || strings.Contains(msg, mlDialCanceled)) && w.stopping() {
		return slog.LevelDebug
	}
	return level
}

func (w *mlLog) stopping() bool {
	select {
	case <-w.stopped:
		return true
	default:
		return false
	}
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
	msg, previous := refutedAlive(msg)
	level = w.mlLevel(level, msg, previous)
	ctx := context.Background()
	if !w.log.Enabled(ctx, level) {
		return len(p), nil
	}
	if level < slog.LevelInfo {
		w.log.Debug(msg, "from", "memberlist")
		return len(p), nil
	}
	kind := level.String() + " " + mlKindOf(msg) // a refutation at info must not hold back one at warn
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
		w.log.Log(ctx, level, msg, "from", "memberlist", "suppressed", suppressed, "per", mlLogEvery)
	case suppressed == 0:
		w.log.Log(ctx, level, msg, "from", "memberlist")
	}
	return len(p), nil
}

// refutedAlive rewrites a "Refuting an alive message" line's metadata,
// which memberlist prints as decimal byte lists ("meta:([123 34 ...] VS
// [...])"), as the JSON text it is, and reports whether the refuted
// metadata is this member's previous run: the same role and id as this
// node's, another generation. Other lines, and metadata that is not a
// byte list of JSON, are returned as they are.
func refutedAlive(msg string) (string, bool) {
	if !strings.HasPrefix(msg, mlRefuteAlive) {
		return msg, false
	}
	const open, vs, end = "meta:([", "] VS [", "])"
	i := strings.Index(msg, open)
	if i < 0 {
		return msg, false
	}
	rest := msg[i+len(open):]
	theirs, rest, ok := strings.Cut(rest, vs)
	if !ok {
		return msg, false
	}
	ours, tail, ok := strings.Cut(rest, end)
	if !ok {
		return msg, false
	}
	a, okA := decimalBytes(theirs)
	b, okB := decimalBytes(ours)
	if !okA || !okB || !json.Valid(a) || !json.Valid(b) {
		return msg, false
	}
	out := msg[:i] + "meta:(" + string(a) + " VS " + string(b) + ")" + tail
	ma, errA := decodeMeta(a)
	mb, errB := decodeMeta(b)
	previous := errA == nil && errB == nil && ma.Role == mb.Role && ma.ID == mb.ID && ma.Gen != mb.Gen
	if previous {
		out += " (previous incarnation)"
	}
	return out, previous
}

// decimalBytes reads "123 34 114" (fmt's %v of a []byte) as bytes.
func decimalBytes(s string) ([]byte, bool) {
	f := strings.Fields(s)
	b := make([]byte, 0, len(f))
	for _, x := range f {
		v, err := strconv.ParseUint(x, 10, 8)
		if err != nil {
			return nil, false
		}
		b = append(b, byte(v))
	}
	return b, true
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
