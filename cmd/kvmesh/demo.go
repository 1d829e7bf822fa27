package main

import (
	"context"
	"errors"
	"io"
)

// runDemo is being written; until then the command says so.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("demo: not built yet")
}
