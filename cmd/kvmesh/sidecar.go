package main

import (
	"context"
	"errors"
	"io"
)

// runSidecar is being written; until then the command says so.
func runSidecar(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("sidecar: not built yet")
}
