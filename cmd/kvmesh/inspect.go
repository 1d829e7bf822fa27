package main

import (
	"context"
	"flag"
	"fmt"
	"io"
)

// runInspect dispatches `kvmesh inspect events|stream`.
func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: kvmesh inspect events|stream [flags]", errUsage)
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprintln(stderr, "Usage: kvmesh inspect events [flags]   decode KV events (a ZMQ endpoint, a replay socket or a file)")
		fmt.Fprintln(stderr, "       kvmesh inspect stream [flags]   tail or summarize the NATS delta stream")
		fmt.Fprintln(stderr, "Run 'kvmesh inspect events -h' or 'kvmesh inspect stream -h' for their flags.")
		return flag.ErrHelp
	case "events":
		return runInspectEvents(ctx, args[1:], stdout, stderr)
	case "stream":
		return runInspectStream(ctx, args[1:], stdout, stderr)
	default:
		return fmt.Errorf("%w: unknown inspect target %q (want events or stream)", errUsage, args[0])
	}
}
