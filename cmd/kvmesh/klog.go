package main

import (
	"context"
	"log/slog"
	"slices"
	"sync/atomic"

	"k8s.io/klog/v2"
)

// klog's logger is a process global that client-go reads from every
// goroutine (klog.Background, on each request) and whose setter must not
// run once any does: it is set once, here, before main, to a handler that
// forwards each line to klogTarget, which a command points at its own
// logger (klogToSlog) with an atomic store.
var klogTarget atomic.Pointer[slog.Logger]

func init() { klog.SetSlogLogger(slog.New(klogHandler{})) }

// klogToSlog sends client-go's log (klog: leader election's "attempting to
// acquire leader lease", a failed lease read, ...) through log, so it
// comes out in the command's format and level, not as klog's text lines
// among the JSON ones a log pipeline parses. Before a command calls it,
// the lines go to slog's default logger.
func klogToSlog(log *slog.Logger) { klogTarget.Store(log.With("component", "client-go")) }

// klogHandler forwards to klogTarget's handler as it is when a line is
// written, replaying the attributes and groups klog's loggers added.
type klogHandler struct {
	ops []func(slog.Handler) slog.Handler
}

func (h klogHandler) target() slog.Handler {
	l := klogTarget.Load()
	if l == nil {
		l = slog.Default()
	}
	t := l.Handler()
	for _, op := range h.ops {
		t = op(t)
	}
	return t
}

func (h klogHandler) Enabled(ctx context.Context, level slog.Level) bool {
	return h.target().Enabled(ctx, level)
}

func (h klogHandler) Handle(ctx context.Context, r slog.Record) error {
	return h.target().Handle(ctx, r)
}

func (h klogHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return klogHandler{ops: append(slices.Clip(h.ops), func(t slog.Handler) slog.Handler { return t.WithAttrs(as) })}
}

func (h klogHandler) WithGroup(name string) slog.Handler {
	return klogHandler{ops: append(slices.Clip(h.ops), func(t slog.Handler) slog.Handler { return t.WithGroup(name) })}
}
