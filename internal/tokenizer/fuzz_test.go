package tokenizer

import (
	"encoding/json"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"
	"unicode/utf8"
)

var fuzzSeeds = []string{
	"Hello world", "  leading and trailing  ", "a\n\n\nb\r\n c", "naïve café 北京 😀 ﷽",
	"I'm THEY'RE we'll 'S", "1234567 3.14159", "<|begin_of_text|>x<|eot_id|>", "\x00\xff\xfe invalid",
	"\t\t word\u3000x", "def f(x):\n    return x*2\n", "İstanbul ΣΑΣ", "e\u0301 \u1e9b\u0323",
}

// FuzzEncode: any input (invalid UTF-8 included) encodes without panicking,
// ids are in range, the prefix cache agrees with a cold encode, and for
// byte-level BPE decode(encode(text)) == text on valid UTF-8.
func FuzzEncode(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	toks := make([]*Native, len(modelNames))
	caches := make([]*CachingTokenizer, len(modelNames))
	for i, name := range modelNames {
		toks[i] = loadNamed(f, name)
		caches[i] = newCache(f, toks[i], CacheConfig{ChunkBytes: 16, MaxTokens: 1 << 16})
	}
	f.Fuzz(func(t *testing.T, text string) {
		for i, tk := range toks {
			ids := tk.Encode(text, true)
			for _, id := range ids {
				if int(id) >= tk.VocabSize() {
					t.Fatalf("%s: id %d out of range", modelNames[i], id)
				}
			}
			// Twice: the second pass hits the chunks the first one stored.
			for range 2 {
				if got := caches[i].Encode(text+" "+text, false); !slices.Equal(got, tk.Encode(text+" "+text, false)) {
					t.Fatalf("%s: cached ids differ from cold for %q", modelNames[i], text)
				}
			}
			_ = tk.Decode(ids, false)
			_ = tk.Decode(ids, true)
		}
		if utf8.ValidString(text) {
			for _, i := range []int{0, 2} { // Llama 3 (no normalizer) and Cohere (NFC)
				want := text
				if i == 2 {
					want = toks[i].normalizer.normalize(text)
				}
				if got := toks[i].Decode(toks[i].Encode(text, false), false); got != want {
					t.Fatalf("%s: round trip %q -> %q", modelNames[i], want, got)
				}
			}
		}
	})
}

// FuzzSplitMatchers: the hand-written Llama 3 and GPT-2 matchers split
// exactly like the patterns compiled as any other tokenizer.json pattern
// (translated from Oniguruma, run by regexp2).
func FuzzSplitMatchers(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add(s)
	}
	f.Add("'ſ 'ſt 'LL 'Ve")
	ref := map[string]splitMatcher{}
	for _, p := range []string{llama3Pattern, gpt2Pattern, qwen2Pattern} {
		re, err := compileOnig(p)
		if err != nil {
			f.Fatal(err)
		}
		ref[p] = &regexMatcher{re: re}
	}
	fast := map[string]splitMatcher{llama3Pattern: llama3Matcher{3}, gpt2Pattern: gpt2Matcher{}, qwen2Pattern: llama3Matcher{1}}
	f.Fuzz(func(t *testing.T, text string) {
		if !utf8.ValidString(text) || len(text) > 256 {
			// regexp2 decodes invalid bytes differently (both are total on
			// them), and it backtracks cubically on long whitespace runs.
			return
		}
		for p, m := range fast {
			got := applyIsolatedFast(nil, text, m.appendMatches(nil, text))
			want := applyIsolatedFast(nil, text, ref[p].appendMatches(nil, text))
			if !slices.Equal(got, want) {
				t.Fatalf("pattern %.30q on %q:\n got %q\nwant %q", p, text, got, want)
			}
		}
	})
}

// FuzzOnigTranslate: any pattern is translated or refused with ErrInvalid or
// ErrUnsupported, never a panic; a translation compiles or is refused as
// ErrUnsupported, and what compiles splits any text.
func FuzzOnigTranslate(f *testing.F) {
	for _, p := range slices.Concat(splitPatterns, refusedPatterns, invalidPatterns) {
		f.Add(p, "Hello wörld ² 12 中文 'S\n")
	}
	f.Fuzz(func(t *testing.T, pattern, text string) {
		re, err := compileOnig(pattern)
		if err != nil {
			if !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupported) {
				t.Fatalf("%q: %v", pattern, err)
			}
			return
		}
		re.MatchTimeout = 50 * time.Millisecond
		last := 0
		for _, m := range (&regexMatcher{re: re}).appendMatches(nil, text) {
			if m.start < last || m.end < m.start || m.end > len(text) {
				t.Fatalf("%q on %q: bad match %v after %d", pattern, text, m, last)
			}
			last = m.end
		}
	})
}

// FuzzLoad: malformed tokenizer.json is an error, never a panic.
func FuzzLoad(f *testing.F) {
	f.Add(`{"model":{"type":"BPE","vocab":{"a":0,"b":1,"ab":2},"merges":["a b"]},"pre_tokenizer":{"type":"ByteLevel"}}`)
	f.Add(`{"model":{"type":"BPE","vocab":{"a":0,"a</w>":1,"b</w>":2,"ab</w>":3,"<unk>":4,"<0x61>":5},"merges":["a b</w>"],"continuing_subword_prefix":"","end_of_word_suffix":"</w>","unk_token":"<unk>","byte_fallback":true},"pre_tokenizer":{"type":"ByteLevel"}}`)
	f.Add(`{"model":{"type":"WordPiece","vocab":{"[UNK]":0,"a":1,"##b":2}},"normalizer":{"type":"BertNormalizer"},"pre_tokenizer":{"type":"BertPreTokenizer"},"post_processor":{"type":"BertProcessing","cls":["[CLS]",1],"sep":["[SEP]",2]}}`)
	f.Add(`{"model":{"type":"Unigram","vocab":[["a",-1.0],["b",-2.0]],"unk_id":0},"pre_tokenizer":{"type":"Metaspace"}}`)
	f.Add(`{"model":{"vocab":{"x":0,"[UNK]":1},"unk_token":"[UNK]"},"pre_tokenizer":{"type":"Split","pattern":{"Regex":"\\s+$|[^\\p{L}&&[^a]]"},"behavior":"Removed"}}`)
	f.Fuzz(func(t *testing.T, data string) {
		tk, err := Load([]byte(data))
		if err != nil {
			return
		}
		ids := tk.Encode("ab a b xab", true)
		_ = tk.Decode(ids, false)
	})
}

// FuzzScanVocab: the fast scanner reads every vocabulary encoding/json
// accepts, identically, and never panics on anything else.
func FuzzScanVocab(f *testing.F) {
	f.Add(`{"a": 0, "\u0120b": 1, "\"q\\": 2, "é": 3}`)
	f.Add(`{"a":1,"a":2}`)
	f.Add(`{ }`)
	f.Add(`{"x": 4294967295}`)
	f.Fuzz(func(t *testing.T, data string) {
		got, err := scanVocab([]byte(data))
		var want map[string]uint32
		if json.Unmarshal([]byte(data), &want) != nil || want == nil {
			return
		}
		if err != nil {
			t.Fatalf("scanner rejected valid vocab %q: %v", data, err)
		}
		if !maps.Equal(got, want) {
			t.Fatalf("%q: got %v want %v", data, got, want)
		}
	})
}
