package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/kvmesh/kvmesh/kvevents"
)

// runKeys prints the canonical kvmesh key (DESIGN.md Contract 1) of every
// full block of a token sequence, one unsigned decimal integer per line:
// the one base of every kvmesh tool (inspect stream, the /debug endpoints).
func runKeys(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys", stderr)
	model := fs.String("model", "", "model name (part of the chain root)")
	blockSize := fs.Int("block-size", 0, "tokens per block (the engine's block size, e.g. 16)")
	lora := fs.String("lora", "", "LoRA adapter name, if any")
	salt := fs.String("salt", "", "cache salt, if any")
	tokens := fs.String("tokens", "", "comma-separated token ids, e.g. 1,2,3")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvmesh keys --model M --block-size B [--lora NAME] [--salt S] --tokens 1,2,3,...")
		fmt.Fprintln(stderr, "Prints one key per line in decimal, as inspect stream --keys and the /debug endpoints show them.")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	var problems []string
	if *model == "" {
		problems = append(problems, "--model is required")
	}
	if *blockSize <= 0 {
		problems = append(problems, "--block-size must be a positive integer")
	}
	ids, err := parseTokens(*tokens)
	if err != nil {
		problems = append(problems, err.Error())
	}
	if len(problems) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(problems, "; "))
	}
	keys := kvevents.AppendKeys(nil, kvevents.Root(*model, *lora, *salt), ids, *blockSize)
	if rest := len(ids) % *blockSize; rest != 0 {
		// Only full blocks have keys: without this, fewer tokens than one
		// block printed nothing and exited 0, as if there were no keys to find.
		fmt.Fprintf(stderr, "kvmesh keys: %d tokens are %d full blocks of %d; the last %d fill no block and have no key\n",
			len(ids), len(keys), *blockSize, rest)
	}
	w := bufio.NewWriter(stdout)
	var buf []byte
	for _, k := range keys {
		buf = strconv.AppendUint(buf[:0], k, 10)
		buf = append(buf, '\n')
		if _, err := w.Write(buf); err != nil {
			return fmt.Errorf("write: %w", err)
		}
	}
	return w.Flush()
}

// parseTokens parses "1,2,3" (spaces allowed) into uint32 token ids.
func parseTokens(s string) ([]uint32, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil, fmt.Errorf("--tokens is required")
	}
	parts := strings.Split(s, ",")
	ids := make([]uint32, 0, len(parts))
	for i, p := range parts {
		v, err := strconv.ParseUint(strings.TrimSpace(p), 10, 32)
		if err != nil {
			return nil, fmt.Errorf("--tokens: item %d %q is not a token id (0..4294967295)", i+1, strings.TrimSpace(p))
		}
		ids = append(ids, uint32(v))
	}
	return ids, nil
}
