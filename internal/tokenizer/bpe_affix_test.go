package tokenizer

import (
	"encoding/json"
	"slices"
	"testing"
)

// byteLevelAffixJSON is a CLIP-shaped tokenizer.json: a Split that keeps
// letter runs, digits and punctuation runs, then ByteLevel, over a BPE whose
// vocabulary is spelled in the byte-level alphabet. Its vocabulary holds the
// letters, each also with the prefix (not first in a word) and with the
// suffix (last in a word), the merges' results, and extra tokens.
func byteLevelAffixJSON(prefix, suffix, unk string, byteFallback bool, extra []string) string {
	vocab := map[string]int{}
	add := func(tok string) {
		if _, ok := vocab[tok]; !ok {
			vocab[tok] = len(vocab)
		}
	}
	for c := 'a'; c <= 'z'; c++ {
		add(string(c))
		add(prefix + string(c))
		add(string(c) + suffix)
		add(prefix + string(c) + suffix)
	}
	for _, t := range extra {
		add(t)
	}
	merges := [][2]string{
		{"h", prefix + "e"}, {prefix + "l", prefix + "l"}, {prefix + "l", prefix + "o" + suffix},
		{"he", prefix + "ll"}, {"w", prefix + "o"}, {prefix + "r", prefix + "l"}, {prefix + "rl", prefix + "d" + suffix},
		{"a", prefix + "b" + suffix}, {"o", prefix + "k" + suffix},
	}
	for _, m := range merges {
		add(m[0] + m[1][len(prefix):])
	}
	model := map[string]any{"type": "BPE", "vocab": vocab, "merges": merges, "fuse_unk": false,
		"byte_fallback": byteFallback, "continuing_subword_prefix": nil, "end_of_word_suffix": nil, "unk_token": nil}
	if prefix != "" {
		model["continuing_subword_prefix"] = prefix
	}
	if suffix != "" {
		model["end_of_word_suffix"] = suffix
	}
	if unk != "" {
		model["unk_token"] = unk
	}
	m, _ := json.Marshal(model)
	return `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[` +
		`{"type":"Split","pattern":{"Regex":"[\\p{L}]+|[\\p{N}]|[^\\s\\p{L}\\p{N}]+"},"behavior":"Removed","invert":true},` +
		`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},` +
		`"post_processor":null,"decoder":null,"model":` + string(m) + `}`
}

var byteLevelAffixTexts = []string{"a", "ab", "hello world", "hello", "helo", "wow ok", "héllo", "x1 é", "!!"}

// byteLevelAffixCases are byteLevelAffixJSON variants with the ids
// tokenizers 0.23.2 gives for byteLevelAffixTexts (TestByteLevelAffixesMatchReference
// checks them against it).
var byteLevelAffixCases = []struct {
	name, json string
	want       [][]uint32
}{
	{"clip_suffix", byteLevelAffixJSON("", "</w>", "", false, nil),
		[][]uint32{{1}, {59}, {55, 29, 56, 58}, {55, 29}, {52, 54}, {56, 45, 60}, {14, 53, 29}, {47}, {}}},
	{"prefix", byteLevelAffixJSON("##", "", "", false, nil),
		[][]uint32{{0}, {59}, {55, 29, 56, 58}, {55, 29}, {52, 54}, {56, 45, 60}, {14, 53, 29}, {46}, {}}},
	{"prefix_suffix_unk", byteLevelAffixJSON("##", "</w>", "<unk>", false, []string{"<unk>"}),
		[][]uint32{{2}, {112}, {108, 59, 109, 111}, {108, 59}, {105, 107}, {109, 91, 113}, {28, 104, 104, 106, 59}, {94, 104, 104, 104}, {104, 104}}},
	{"suffix_fallback", byteLevelAffixJSON("", "</w>", "<unk>", true,
		[]string{"<unk>", "<0xC3>", "<0x83>", "<0xC2>", "<0xA9>", "<0x3C>", "<0x2F>", "<0x77>", "<0x3E>"}),
		[][]uint32{{1}, {68}, {64, 29, 65, 67}, {64, 29}, {61, 63}, {65, 45, 69}, {14, 53, 54, 55, 56, 62, 29}, {47, 52, 53, 54, 55, 56, 57, 58, 59, 60}, {52, 52}}},
	// No affixes, but a byte without a token and an unknown token to spell it.
	{"unk_no_affix", byteLevelAffixJSON("", "", "<unk>", false, []string{"<unk>"}),
		[][]uint32{{0}, {34}, {30, 14, 31, 33}, {30, 14}, {27, 29}, {31, 22, 35}, {7, 26, 26, 28, 14}, {23, 26, 26, 26}, {26, 26}}},
}

// TestByteLevelAffixes: behind a ByteLevel pre-tokenizer the BPE model spells
// each byte with continuing_subword_prefix (not first) and end_of_word_suffix
// (last), and a byte without a token with byte fallback or the unknown
// token, as tokenizers does; the byte-level fast path used to ignore all of
// them (CLIP's tokenizer: 'a' was [97], not a</w>).
func TestByteLevelAffixes(t *testing.T) {
	for _, c := range byteLevelAffixCases {
		t.Run(c.name, func(t *testing.T) {
			tk := mustLoad(t, c.json)
			for i, text := range byteLevelAffixTexts {
				if got := tk.Encode(text, false); !slices.Equal(got, c.want[i]) {
					t.Errorf("%q: got %v want %v", text, got, c.want[i])
				}
			}
		})
	}
}

// TestByteLevelAffixesMatchReference holds byteLevelAffixCases' ids to tokenizers.
func TestByteLevelAffixesMatchReference(t *testing.T) {
	jobs := make([]refJob, len(byteLevelAffixCases))
	for i, c := range byteLevelAffixCases {
		jobs[i] = refJob{Tokenizer: c.json, Texts: byteLevelAffixTexts}
	}
	ref := tokref(t, jobs)
	for i, c := range byteLevelAffixCases {
		if ref[i].LoadErr != "" {
			t.Fatalf("%s: reference: %s", c.name, ref[i].LoadErr)
		}
		for k, text := range byteLevelAffixTexts {
			r := ref[i].Results[k]
			if r.Err != "" {
				t.Fatalf("%s %q: reference error %s", c.name, text, r.Err)
			}
			if !slices.Equal(c.want[k], r.IDs) {
				t.Errorf("%s %q: test expects %v, reference %v", c.name, text, c.want[k], r.IDs)
			}
		}
	}
}
