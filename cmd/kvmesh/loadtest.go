package main

import (
	"context"
	"errors"
	"io"
)

// runLoadtest is being written; until then the command says so.
func runLoadtest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("loadtest: not built yet")
}
