package tokenizer

import (
	"encoding/base64"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The original Llama 3 files (tiktoken.model + tokenizer_config.json) give
// the ids Hugging Face gives with Meta's tokenizer.json, on every golden text.
func TestTiktokenLlama3MatchesHF(t *testing.T) {
	if raceEnabled {
		t.Skip("a 128k vocabulary conversion takes too long under -race; run without -race")
	}
	dir := filepath.Join(tokenizerDataDir(t), "meta-llama-3-8b-instruct")
	tk, err := LoadTiktoken(filepath.Join(dir, "tiktoken.model"), filepath.Join(dir, "tokenizer_config.json"), TiktokenPatternLlama3)
	if err != nil {
		t.Fatal(err)
	}
	if tk.VocabSize() != 128256 {
		t.Fatalf("vocab %d, want 128256", tk.VocabSize())
	}
	g := loadGolden(t, "Meta-Llama-3-8B-Instruct")
	for i, c := range g.Cases {
		if got := tk.Encode(c.Text, false); !slices.Equal(got, c.IDsPlain) {
			t.Errorf("case %d: got %v, want %v (text %.60q)", i, got, c.IDsPlain, c.Text)
		}
	}
}

// Kimi K2's files give the ids of the tiktoken reference (tiktoken-rs, as
// pinned by the daulet/tokenizers tests): its pattern uses class
// intersections, special tokens are matched in text, no BOS is added.
func TestTiktokenKimi(t *testing.T) {
	if raceEnabled {
		t.Skip("a 160k vocabulary conversion takes too long under -race; run without -race")
	}
	// LoadPath finds tiktoken.model in the directory and picks Kimi's
	// pattern from the config's tokenizer_class.
	tk, err := LoadPath(filepath.Join(tokenizerDataDir(t), "kimi-k2-instruct"))
	if err != nil {
		t.Fatal(err)
	}
	if tk.VocabSize() != 163840 {
		t.Fatalf("vocab %d, want 163840", tk.VocabSize())
	}
	for _, c := range []struct {
		text    string
		special bool
		want    []uint32
	}{
		{"Hello, world! 你好，世界！", false, []uint32{19180, 11, 2695, 0, 220, 33845, 378, 2243, 856}},
		{"Hello, world! 你好，世界！", true, []uint32{19180, 11, 2695, 0, 220, 33845, 378, 2243, 856}},
		{"<|im_middle|>Hello, world! 你好，世界！<|im_end|>", true, []uint32{163601, 19180, 11, 2695, 0, 220, 33845, 378, 2243, 856, 163586}},
	} {
		if got := tk.Encode(c.text, c.special); !slices.Equal(got, c.want) {
			t.Errorf("%q: got %v, want %v", c.text, got, c.want)
		}
		if got := tk.Decode(c.want, false); got != c.text {
			t.Errorf("decode %v: %q", c.want, got)
		}
	}
}

// FuzzTiktoken: any tiktoken file and config either load or fail with
// ErrInvalid/ErrUnsupported, never a panic; what loads encodes and decodes
// its own bytes.
func FuzzTiktoken(f *testing.F) {
	var base strings.Builder
	for b := 0; b < 256; b++ {
		fmt.Fprintf(&base, "%s %d\n", base64.StdEncoding.EncodeToString([]byte{byte(b)}), b)
	}
	f.Add(base.String()+base64.StdEncoding.EncodeToString([]byte("ab"))+" 256\n", `{"added_tokens_decoder":{"257":{"content":"<s>","special":true}},"bos_token":"<s>","add_bos_token":true}`, "ab abc")
	f.Add(base.String(), `{}`, "x")
	f.Add("QQ== 1\n", `{"added_tokens_decoder":{"x":{}}}`, "")
	f.Fuzz(func(t *testing.T, model, cfg, text string) {
		ranks, err := parseTiktoken(strings.NewReader(model))
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("parse: %v", err)
			}
			return
		}
		data, err := tiktokenJSON(ranks, []byte(cfg), TiktokenPatternLlama3)
		if err != nil {
			if !errors.Is(err, ErrInvalid) {
				t.Fatalf("convert: %v", err)
			}
			return
		}
		tk, err := Load(data)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("load: %v", err)
			}
			return
		}
		_ = tk.Decode(tk.Encode(text, true), false)
	})
}
