package main

import (
	"context"
	"errors"
	"io"
)

// runInspect is being written; until then the command says so.
func runInspect(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("inspect: not built yet")
}
