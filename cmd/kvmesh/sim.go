package main

import (
	"context"
	"errors"
	"io"
)

// runSim is being written; until then the command says so.
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return errors.New("sim: not built yet")
}
