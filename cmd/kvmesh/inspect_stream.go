package main

import (
	"context"
	"errors"
	"io"
)

// runInspectStream is being written; until then the command says so.
func runInspectStream(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("inspect: not built yet")
}
