package tokenizer

import (
	"path/filepath"
	"slices"
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

func TestRewriteClassIntersections(t *testing.T) {
	got := rewriteClassIntersections(`a[\p{Lu}\p{M}&&[^\p{Han}]]*b`)
	if want := `a(?:(?![\p{Han}])[\p{Lu}\p{M}])*b`; got != want {
		t.Fatalf("got %s want %s", got, want)
	}
}
