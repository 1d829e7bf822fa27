package tokenizer

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// TestMergeLargeEqualsSmall: the heap merge used for long words gives the
// same ids as the scan used for short ones.
func TestMergeLargeEqualsSmall(t *testing.T) {
	text := strings.ReplaceAll(longText(t)[:20000], " ", "")
	rng := rand.New(rand.NewPCG(3, 4))
	for _, name := range []string{"Meta-Llama-3-8B-Instruct", "cohere-tokenizer"} {
		m := loadNamed(t, name).model.(*bpe)
		var sc bpeScratch
		for i := 0; i < 200; i++ {
			n := 2 + rng.IntN(300)
			start := rng.IntN(len(text) - n)
			word := text[start : start+n]
			if i%10 == 0 {
				word = strings.Repeat(" ", n) // long whitespace runs
			}
			a := slices.Clone(m.mergeSmall(m.initialSymbols(nil, word), &sc))
			b := slices.Clone(m.mergeLarge(m.initialSymbols(nil, word), &sc))
			if !slices.Equal(a, b) {
				t.Fatalf("%s: %q: small %v large %v", name, word, a, b)
			}
		}
	}
}

// TestContractionFolding: (?i) contractions fold like Oniguruma and Rust's
// regex, including the long s.
func TestContractionFolding(t *testing.T) {
	cases := map[string][]string{
		"'ſa":     {"'ſ", "a"},
		"'LLa":    {"'LL", "a"},
		"I'M":     {"I", "'M"},
		"x'ab":    {"x", "'ab"},
		"a  b":    {"a", " ", " b"},
		"a \n b":  {"a", " \n", " b"},
		"12345":   {"123", "45"},
		"!!\n\nx": {"!!\n\n", "x"},
		"a   ":    {"a", "   "},
	}
	for in, want := range cases {
		if got := applyIsolatedFast(nil, in, llama3Matcher{3}.appendMatches(nil, in)); !slices.Equal(got, want) {
			t.Errorf("%q: got %q want %q", in, got, want)
		}
	}
}
