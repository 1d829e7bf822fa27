package main

import (
	"context"
	"errors"
	"io"
)

// runInspectEvents is being written; until then the command says so.
func runInspectEvents(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("inspect: not built yet")
}
