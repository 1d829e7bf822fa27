package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"
)

func tokenizerTestData(t *testing.T) string {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/daulet/tokenizers").Output()
	if err != nil {
		t.Fatalf("go mod download: %v", err)
	}
	var v struct{ Dir string }
	if err := json.Unmarshal(out, &v); err != nil || v.Dir == "" {
		t.Fatalf("module dir: %v", err)
	}
	return filepath.Join(v.Dir, "test", "data")
}

func runTokenizeIDs(t *testing.T, args ...string) []uint32 {
	t.Helper()
	var stdout, stderr bytes.Buffer
	if err := runTokenize(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("tokenize %v: %v (stderr %s)", args, err, stderr.String())
	}
	var ids []uint32
	if err := json.Unmarshal(stdout.Bytes(), &ids); err != nil {
		t.Fatalf("output %q is not a JSON array: %v", stdout.String(), err)
	}
	return ids
}

// TestTokenizeCommand checks the command against the golden ids: a text
// file with and without --special, and a chat from --messages.
func TestTokenizeCommand(t *testing.T) {
	data := tokenizerTestData(t)
	// Text cases use the small BERT file (loading Llama 3 under -race is slow);
	// the chat case needs Llama 3.
	bertPath := filepath.Join(data, "bert-base-uncased.json")
	tokPath := filepath.Join(data, "Meta-Llama-3-8B-Instruct.json")
	var golden map[string]json.RawMessage
	var bert struct {
		Cases []struct {
			Text       string   `json:"text"`
			IDsSpecial []uint32 `json:"ids_special"`
			IDsPlain   []uint32 `json:"ids_plain"`
		} `json:"cases"`
	}
	b, err := os.ReadFile("../../testdata/tokenizer/golden.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &golden); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(golden["bert-base-uncased"], &bert); err != nil {
		t.Fatal(err)
	}
	c := bert.Cases[3]
	textFile := filepath.Join(t.TempDir(), "text.txt")
	if err := os.WriteFile(textFile, []byte(c.Text), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := runTokenizeIDs(t, "--tokenizer", bertPath, textFile); !slices.Equal(got, c.IDsPlain) {
		t.Errorf("plain ids differ: got %d ids, want %d", len(got), len(c.IDsPlain))
	}
	if got := runTokenizeIDs(t, "--tokenizer", bertPath, "--special", textFile); !slices.Equal(got, c.IDsSpecial) {
		t.Errorf("special ids differ: got %d ids, want %d", len(got), len(c.IDsSpecial))
	}

	var chat struct {
		Cases []struct {
			Messages json.RawMessage `json:"messages"`
			IDs      []uint32        `json:"ids"`
		} `json:"cases"`
	}
	b, err = os.ReadFile("../../testdata/tokenizer/chat_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &chat); err != nil {
		t.Fatal(err)
	}
	msgFile := filepath.Join(t.TempDir(), "messages.json")
	if err := os.WriteFile(msgFile, chat.Cases[0].Messages, 0o644); err != nil {
		t.Fatal(err)
	}
	got := runTokenizeIDs(t, "--tokenizer", tokPath, "--chat-template",
		filepath.Join(data, "meta-llama-3-8b-instruct", "tokenizer_config.json"), "--messages", msgFile)
	if !slices.Equal(got, chat.Cases[0].IDs) {
		t.Errorf("chat ids differ: got %d ids, want %d", len(got), len(chat.Cases[0].IDs))
	}
}

func TestTokenizeUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--tokenizer", "x.json", "--messages", "m.json"},
		{"--tokenizer", "x.json", "a.txt", "b.txt"},
		{"--tokenizer", "x.json", "--no-generation-prompt", "a.txt"}, // read with --messages only
	} {
		var stdout, stderr bytes.Buffer
		err := runTokenize(context.Background(), args, &stdout, &stderr)
		if !errors.Is(err, errUsage) {
			t.Errorf("args %v: got %v, want a usage error", args, err)
		}
	}
	var stdout, stderr bytes.Buffer
	if err := runTokenize(context.Background(), []string{"--tokenizer", filepath.Join(t.TempDir(), "missing.json")}, &stdout, &stderr); err == nil || errors.Is(err, errUsage) {
		t.Errorf("missing file: got %v, want a load error", err)
	}
}

// TestTokenizeStdin: without TEXTFILE the text comes from standard input.
func TestTokenizeStdin(t *testing.T) {
	data := tokenizerTestData(t)
	in := filepath.Join(t.TempDir(), "stdin.txt")
	if err := os.WriteFile(in, []byte("Hello, world!"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(in)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	saved := os.Stdin
	os.Stdin = f
	defer func() { os.Stdin = saved }()
	got := runTokenizeIDs(t, "--tokenizer", filepath.Join(data, "bert-base-uncased.json"), "--special")
	// [CLS] hello , world ! [SEP] in bert-base-uncased.
	if want := []uint32{101, 7592, 1010, 2088, 999, 102}; !slices.Equal(got, want) {
		t.Fatalf("got %v want %v", got, want)
	}
}

// TestTokenizeDirectory: --tokenizer takes a model directory holding
// tokenizer.json, as the ingress's --tokenizer and the simulator's do
// ("read DIR: is a directory" before).
func TestTokenizeDirectory(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(tokenizerTestData(t), "bert-base-uncased.json"))
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	text := filepath.Join(t.TempDir(), "in.txt")
	if err := os.WriteFile(text, []byte("hello world"), 0o644); err != nil {
		t.Fatal(err)
	}
	fromDir := runTokenizeIDs(t, "--tokenizer", dir, text)
	fromFile := runTokenizeIDs(t, "--tokenizer", filepath.Join(dir, "tokenizer.json"), text)
	if len(fromDir) == 0 || !slices.Equal(fromDir, fromFile) {
		t.Fatalf("directory: %v, file: %v", fromDir, fromFile)
	}
}
