package main

import (
	"context"
	"fmt"
	"io"
)

// runInspect dispatches `kvmesh inspect events|stream`.
func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: kvmesh inspect events|stream [flags]", errUsage)
	}
	switch args[0] {
	case "events":
		return runInspectEvents(ctx, args[1:], stdout, stderr)
	case "stream":
		return runInspectStream(ctx, args[1:], stdout, stderr)
	default:
		return fmt.Errorf("%w: unknown inspect target %q (want events or stream)", errUsage, args[0])
	}
}
