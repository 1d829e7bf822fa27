package main

import (
	"context"
	"errors"
	"io"
)

// runTokenize is being written; until then the command says so.
func runTokenize(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("tokenize: not built yet")
}
