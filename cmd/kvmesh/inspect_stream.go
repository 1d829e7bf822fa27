package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// runInspectStream tails kvmesh.delta.> decoded for people, or (--summary)
// keeps a materialized view and prints per-engine epoch, seq, keys per tier
// and lag. `nats sub 'kvmesh.delta.>'` shows the same messages undecoded.
func runInspectStream(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect stream", stderr)
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{nats.DefaultURL}
	natsutil.BindFlags(fs, &cfg.URLs, &cfg.Auth, "NATS server URLs, comma-separated")
	summary := fs.Bool("summary", false, "print a per-engine summary every --interval instead of each delta")
	interval := fs.Duration("interval", 2*time.Second, "summary period")
	showKeys := fs.Bool("keys", false, "print the keys of each op")
	count := fs.Int("count", 0, "exit after this many deltas (0: until interrupted)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvmesh inspect stream [--nats URL] [--summary [--interval 2s]] [--keys] [--count N]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	var err error
	if *summary { // --keys and --count shape the delta tail; --interval the summary
		err = refuseUnread(fs, "--summary", func(f string) bool { return f != "keys" && f != "count" })
	} else {
		err = refuseUnread(fs, "delta tail (no --summary)", func(f string) bool { return f != "interval" })
	}
	switch {
	case err != nil:
		return err
	case *interval <= 0 || *count < 0:
		return fmt.Errorf("%w: --interval must be > 0 and --count >= 0 (got %v, %d)", errUsage, *interval, *count)
	}
	cfg.Name = "kvmesh-inspect"
	cfg.Stream.Disabled = true // read-only: never create or change the stream
	if len(cfg.URLs) == 0 {
		return fmt.Errorf("%w: --nats is required", errUsage)
	}
	conn, err := natsutil.Connect(ctx, cfg, slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		return err
	}
	defer conn.Close()
	warnNoStream(ctx, conn, stderr)
	if *summary {
		return inspectSummary(ctx, conn.NC, conn.Subjects, *interval, stdout, stderr)
	}
	return inspectTail(ctx, conn.NC, conn.Subjects, *showKeys, *count, stdout)
}

// warnNoStream says on stderr when the NATS has no delta stream of the
// prefix: no sidecar of that installation has run there, or the prefix is
// not the installation's (the tail and summary would just stay empty).
func warnNoStream(ctx context.Context, conn *natsutil.Conn, stderr io.Writer) {
	js, err := jetstream.New(conn.NC)
	if err != nil {
		return
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if _, err := js.Stream(ctx, conn.Subjects.Stream()); errors.Is(err, jetstream.ErrStreamNotFound) {
		fmt.Fprintf(stderr, "no stream %s on this NATS: no sidecar with --nats-prefix %s has run here (is the prefix the installation's?); listening on %s anyway\n",
			conn.Subjects.Stream(), conn.Subjects.Prefix(), conn.Subjects.DeltaWildcard())
	}
}

func inspectTail(ctx context.Context, nc *nats.Conn, subj natsutil.Subjects, showKeys bool, count int, stdout io.Writer) error {
	msgs := make(chan *nats.Msg, 4096)
	sub, err := nc.ChanSubscribe(subj.DeltaWildcard(), msgs)
	if err != nil {
		return fmt.Errorf("inspect stream: %w", err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	var d kvevents.Delta
	for n := 0; count == 0 || n < count; n++ {
		var msg *nats.Msg
		select {
		case <-ctx.Done():
			return nil
		case msg = <-msgs:
		}
		if err := kvevents.DecodeDelta(msg.Data, &d); err != nil {
			fmt.Fprintf(w, "%s malformed (%d bytes): %v\n", msg.Subject, len(msg.Data), err)
		} else {
			fmt.Fprintln(w, formatDelta(&d, showKeys))
		}
		if len(msgs) == 0 {
			_ = w.Flush()
		}
	}
	return nil
}

// formatDelta renders one delta on one line.
func formatDelta(d *kvevents.Delta, showKeys bool) string {
	var b strings.Builder
	ts := time.Unix(0, d.TS).UTC()
	// Keys and epochs in decimal, as kvmesh keys, inspect events and the
	// /debug endpoints print them (docs/OPERATIONS.md, "Looking at it").
	fmt.Fprintf(&b, "%s engine=%s model=%s epoch=%d seq=%d lag=%v",
		ts.Format("15:04:05.000000"), d.Engine, d.Model, d.Epoch, d.Seq, time.Since(ts).Round(time.Microsecond))
	for _, op := range d.Ops {
		if op.Kind == kvevents.OpClear {
			fmt.Fprintf(&b, " | clear %s", op.Tier)
			continue
		}
		fmt.Fprintf(&b, " | %s %s %d", op.Kind, op.Tier, len(op.Keys))
		if showKeys {
			for _, k := range op.Keys {
				fmt.Fprintf(&b, " %d", k)
			}
		}
	}
	return b.String()
}

// countIndex is a no-op index: the summary reads the materializer's own sets.
type countIndex struct{}

func (c *countIndex) Store(string, kvevents.Tier, []uint64)  {}
func (c *countIndex) Remove(string, kvevents.Tier, []uint64) {}
func (c *countIndex) ClearEngine(string)                     {}

var _ materialize.Index = (*countIndex)(nil)

func inspectSummary(ctx context.Context, nc *nats.Conn, subj natsutil.Subjects, interval time.Duration, stdout, stderr io.Writer) error {
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Subjects, cfg.Index = nc, subj, &countIndex{}
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	m, err := materialize.New(cfg)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return <-done
		case err := <-done:
			return err
		case <-t.C:
			printSummary(stdout, m.Status())
		}
	}
}

func printSummary(w io.Writer, st []materialize.EngineStatus) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\nENGINE\tMODEL\tEPOCH\tSEQ\tGPU\tCPU\tOTHER\tLAG\tSYNCED\n", time.Now().UTC().Format(time.RFC3339))
	for _, s := range st {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%d\t%v\t%v\n", s.Engine, s.Model, s.Epoch, s.Seq,
			s.Keys[kvevents.TierGPU], s.Keys[kvevents.TierCPU], s.Keys[kvevents.TierOther], s.Lag.Round(time.Microsecond), s.Synced)
	}
	_ = tw.Flush()
}
