package main

import (
	"bytes"
	"encoding/binary"
	"strconv"
	"strings"
	"testing"

	"github.com/zeebo/xxh3"
)

// TestKeysCommand checks the printed keys against Contract 1 computed here
// directly with xxh3 over explicit little-endian bytes.
func TestKeysCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	code := run([]string{"keys", "--model", "meta-llama/Llama-3.1-8B", "--block-size", "4", "--lora", "ad", "--salt", "s",
		"--tokens", "1, 2,3,4,5,6,7,4294967295,9,10"}, &out, &errOut)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	parent := xxh3.Hash([]byte("kvmesh/v1\x00meta-llama/Llama-3.1-8B\x00ad\x00s"))
	var want []string
	for _, block := range [][]uint32{{1, 2, 3, 4}, {5, 6, 7, 4294967295}} { // 9,10 is a partial block
		raw := make([]byte, 0, 16)
		for _, tok := range block {
			raw = binary.LittleEndian.AppendUint32(raw, tok)
		}
		parent = xxh3.HashSeed(raw, parent)
		want = append(want, strconv.FormatUint(parent, 10))
	}
	if got := strings.Fields(out.String()); strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("keys %v, want %v", got, want)
	}
	// The partial block is said on stderr, stdout keeping only keys.
	if !strings.Contains(errOut.String(), "the last 2 fill no block") {
		t.Errorf("stderr %q does not name the 2 tokens without a key", errOut.String())
	}
	// Fewer tokens than one block: no key, and a note rather than silence.
	out.Reset()
	errOut.Reset()
	if code := run([]string{"keys", "--model", "m", "--block-size", "4", "--tokens", "1,2"}, &out, &errOut); code != 0 || out.Len() != 0 ||
		!strings.Contains(errOut.String(), "2 tokens are 0 full blocks of 4") {
		t.Errorf("2 tokens, block size 4: exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	errOut.Reset()
	if code := run([]string{"keys", "--model", "m", "--block-size", "2", "--tokens", "1,2"}, &out, &errOut); code != 0 || errOut.Len() != 0 {
		t.Errorf("full blocks only: exit %d, stderr %q; want nothing on stderr", code, errOut.String())
	}
}

func TestKeysCommandUsage(t *testing.T) {
	for _, args := range [][]string{
		{"keys", "--block-size", "16", "--tokens", "1"},
		{"keys", "--model", "m", "--tokens", "1"},
		{"keys", "--model", "m", "--block-size", "16"},
		{"keys", "--model", "m", "--block-size", "16", "--tokens", "1,-2"},
		{"keys", "--model", "m", "--block-size", "16", "--tokens", "4294967296"},
	} {
		var out, errOut bytes.Buffer
		if code := run(args, &out, &errOut); code != 2 || out.Len() != 0 || errOut.Len() == 0 {
			t.Errorf("%v: exit %d, stdout %q, stderr %q", args, code, out.String(), errOut.String())
		}
	}
}
