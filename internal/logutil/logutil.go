// Package logutil builds the components' loggers: one log format flag shared
// by every long-running command (ingress, epp, sidecar, sim, orchestrator), so
// a cluster's log pipeline parses every kvmesh process the same way.
package logutil

import (
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// Formats a log can be written in: JSON objects (one per line, what log
// pipelines in Kubernetes parse) or slog's key=value text.
const (
	JSON = "json"
	Text = "text"
)

// CheckFormat reports whether format is JSON or Text.
func CheckFormat(format string) error {
	if f := strings.ToLower(format); f != JSON && f != Text { // any case, as --log-level's names
		return fmt.Errorf("log-format %q: want %s or %s", format, JSON, Text)
	}
	return nil
}

// New returns a logger writing format to w at level; an unknown format
// writes JSON (CheckFormat is where a user's value is refused).
func New(w io.Writer, format string, level slog.Leveler) *slog.Logger {
	o := &slog.HandlerOptions{Level: level}
	if strings.EqualFold(format, Text) {
		return slog.New(slog.NewTextHandler(w, o))
	}
	o.ReplaceAttr = durationText
	return slog.New(slog.NewJSONHandler(w, o))
}

// durationText writes a duration as the text format does ("1.5s", "2m0s"),
// not as JSON's integer nanoseconds: the same reading in both formats, and
// what the components' own duration attributes use.
func durationText(_ []string, a slog.Attr) slog.Attr {
	if a.Value.Kind() == slog.KindDuration {
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}
