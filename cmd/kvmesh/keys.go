package main

import (
	"context"
	"errors"
	"io"
)

// runKeys is being written; until then the command says so.
func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("keys: not built yet")
}
