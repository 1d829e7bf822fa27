package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// splitOnlyJSON is a tokenizer.json whose pre-tokenizer is pre (raw JSON)
// over a one-token WordLevel model: the pieces are what is compared.
func splitOnlyJSON(pre string) string {
	return `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":` + pre +
		`,"post_processor":null,"decoder":null,"model":{"type":"WordLevel","vocab":{"[UNK]":0},"unk_token":"[UNK]"}}`
}

func splitJSON(pattern, behavior string, invert bool) string {
	p, _ := json.Marshal(pattern)
	return splitOnlyJSON(fmt.Sprintf(`{"type":"Split","pattern":{"Regex":%s},"behavior":%q,"invert":%v}`, p, behavior, invert))
}

// pieces pre-tokenizes text with tk's pre-tokenizer alone.
func pieces(tk *Native, text string) []string {
	if text == "" {
		return nil
	}
	return slices.Clone(tk.pre.split([]string{text}, &scratch{}, true))
}

// splitPatterns are Split regexes from real tokenizer.json files and the
// Oniguruma constructs whose meaning differs from regexp2's. refused are the
// ones Native does not translate (ErrUnsupported) though Oniguruma takes them.
var (
	splitPatterns = []string{
		gpt2Pattern, llama3Pattern, qwen2Pattern, TiktokenPatternKimi,
		// GPT-4o (o200k), Mistral Tekken, Qwen3.5, DeepSeek-V3's three, BLOOM, Falcon
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
		`[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
		`(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
		`\p{N}{1,3}`, `[一-龥\x{3040}-ゟ゠-ヿ]+`,
		"[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\\r\\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| ?[\\p{P}\\p{S}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
		` ?[^(\s|[.,!?…。，、।۔،])]+`, `[0-9][0-9][0-9]`,
		// anchors: $ and ^ are per line in Oniguruma; \b, \B with its word characters
		`\s+$|\S+|\s+`, `\S\s+^|.`, `^\s*\w+|.`, `\w+$|.`, `\b\w`, `\B\w+`, `\w+|[^\w\s]+`, `\Aa|b\z|\s\Z`,
		// classes: nesting, intersection, ']' and '-' as literals, escapes
		`[\p{L}&&[^\p{Han}]]+|\p{Han}+|.`, `[^a-z&&b-y]+`, `[a-c[x-z]]+`, `[^a[^b]]+`, `[\w&&[^\d]]+`,
		`[\p{L}&&\p{Lu}&&[^A-C]]+`, `[]a]+|[a-]+`, `[\W\d]+`, `[^\s\p{P}]+`, `\h+|\H`, `[\x{1F600}\u00e9\x41]+`,
		`\d+|\D`, `.{1,3}`, `\p{Han}+|\P{Han}+|\p{^L}+`, `[\p{Lu}\p{Lt}]+|[^\p{Lu}]+`, `\p{Letter}+|\p{Alpha}+`,
		// (?i) runs to the end of its group, across '|'
		`a(?i)b|c`, `(?i:'s|'t|'re|'ve|'m|'ll|'d)`, `(?i)[a-z]+|\d`, `(?i)k(?-i)s|S`,
		// quantifiers: {,n}, literal braces, lazy, possessive; groups
		`x{,2}`, `x{1, 2}|x{,}|a{2,}`, `x{1,2}?y|x+?`, `\d*+\d|\w++`, `(?>a+)b|(?<n>c)d|(c)`,
		`(?<=\d)\s|(?<!\w)\d+|(?=b)|\s*`, `x*`, `-|\.`,
	}
	refusedPatterns = []string{`\p{Emoji}+|.`, `(?i)[a-zß]+|.`, `(?i)st`, `[[:alpha:]]+`, `(a)\1`, `(?x) a`, `a{2}?`}
	invalidPatterns = []string{`(`, `[a`, `*a`, `a)`, `{2}`, `[\w-a]`, `[b-a]`}
)

var patternTexts = append(slices.Clone(fidelityTexts),
	"\n\nleading", "a \nb  \n", "ab\ncd\n", "axxb abab", "'ſ 'ß ﬆ ss SS ẞ 'S 'll", "aC ab AB C abcd",
	"x{1, 2} x{,} aaaa ]a -a xxxy xy", "0xFF af0xg 😀 é A", "a1 b2 _c ³d 12 3", "   ", "x", "中文English混合テスト")

// TestSplitPatternsMatchReference: every pattern splits every text into the
// pieces tokenizers gives (Oniguruma), or is refused as the reference
// refuses it (ErrInvalid) or as not translated (ErrUnsupported, listed).
func TestSplitPatternsMatchReference(t *testing.T) {
	all := slices.Concat(splitPatterns, refusedPatterns, invalidPatterns)
	jobs := make([]refJob, len(all))
	for i, p := range all {
		jobs[i] = refJob{Tokenizer: splitJSON(p, "Isolated", false), Texts: patternTexts}
	}
	ref := tokref(t, jobs)
	for i, p := range all {
		tk, err := Load([]byte(jobs[i].Tokenizer))
		switch {
		case ref[i].LoadErr != "":
			if !errors.Is(err, ErrInvalid) {
				t.Errorf("%s: the reference refuses it (%.80s); Load: %v", p, ref[i].LoadErr, err)
			}
			continue
		case slices.Contains(refusedPatterns, p):
			if !errors.Is(err, ErrUnsupported) {
				t.Errorf("%s: want ErrUnsupported, got %v", p, err)
			}
			continue
		case err != nil:
			t.Errorf("%s: %v", p, err)
			continue
		}
		bad := 0
		for k, text := range patternTexts {
			want := ref[i].Results[k].Pieces
			if got := pieces(tk, text); !slices.Equal(got, want) {
				if bad++; bad <= 3 {
					t.Errorf("%s on %q:\n got  %q\n want %q", p, text, got, want)
				}
			}
		}
	}
}

// TestSplitBehaviorsMatchReference: the five behaviors, inverted or not, with
// patterns that match empty strings (an empty match splits too, as in
// tokenizers' find_matches) and ones that do not, regexes and literals (the
// empty literal matches at every character boundary).
func TestSplitBehaviorsMatchReference(t *testing.T) {
	type pattern struct {
		s     string
		regex bool
	}
	patterns := []pattern{{`x*`, true}, {`(?=b)`, true}, {`\s+`, true}, {`\d`, true}, {`b|`, true}, {"", false}, {"ab", false}}
	texts := []string{"axxb abab", "ab", "a1b22 c", "  x  ", "bbb", "x", "é中"}
	type job struct {
		pattern pattern
		beh     string
		invert  bool
	}
	var cases []job
	var jobs []refJob
	for _, p := range patterns {
		for beh := range behaviors {
			for _, inv := range []bool{false, true} {
				cases = append(cases, job{p, beh, inv})
				kind := "String"
				if p.regex {
					kind = "Regex"
				}
				pre := fmt.Sprintf(`{"type":"Split","pattern":{%q:%s},"behavior":%q,"invert":%v}`, kind, jsonString(p.s), beh, inv)
				jobs = append(jobs, refJob{Tokenizer: splitOnlyJSON(pre), Texts: texts})
			}
		}
	}
	ref := tokref(t, jobs)
	for i, c := range cases {
		tk, err := Load([]byte(jobs[i].Tokenizer))
		if err != nil {
			t.Fatalf("%+v: %v", c, err)
		}
		for k, text := range texts {
			if got, want := pieces(tk, text), ref[i].Results[k].Pieces; !slices.Equal(got, want) {
				t.Errorf("%q (regex %v) %s invert=%v on %q: got %q want %q", c.pattern.s, c.pattern.regex, c.beh, c.invert, text, got, want)
			}
		}
	}
}

// TestComponentsMatchReference: normalizers and pre-tokenizers put in front
// of Llama 3's byte-level BPE (so any difference in the text they produce
// shows in the ids), against the reference's ids and normalized text.
func TestComponentsMatchReference(t *testing.T) {
	const byteLevel = `{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}`
	pre := func(p string) map[string]string {
		return map[string]string{"pre_tokenizer": `{"type":"Sequence","pretokenizers":[` + p + `,` + byteLevel + `]}`}
	}
	withNorm := func(n string) map[string]string { return map[string]string{"normalizer": n} }
	fixtures := []struct {
		name          string
		replace       map[string]string
		normalizeOnly bool
	}{
		// Falcon: Punctuation, ByteLevel, Digits, a three-digit Split
		{"falcon", map[string]string{"pre_tokenizer": `{"type":"Sequence","pretokenizers":[{"type":"Punctuation","behavior":"Contiguous"},` +
			`{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},{"type":"Digits","individual_digits":false},` +
			`{"type":"Split","pattern":{"Regex":"[0-9][0-9][0-9]"},"behavior":"Isolated","invert":false}]}`}, false},
		{"starcoder", pre(`{"type":"Digits","individual_digits":true}`), false},
		{"kimi_split", pre(`{"type":"Split","pattern":{"Regex":` + jsonString(TiktokenPatternKimi) + `},"behavior":"Isolated","invert":false}`), false},
		{"bloom_split", pre(`{"type":"Split","pattern":{"Regex":" ?[^(\\s|[.,!?…。，、।۔،])]+"},"behavior":"Isolated","invert":false}`), false},
		{"whitespace", pre(`{"type":"Whitespace"}`), false},
		{"whitespace_split", pre(`{"type":"WhitespaceSplit"}`), false},
		{"bert_pre", pre(`{"type":"BertPreTokenizer"}`), false},
		{"punctuation", pre(`{"type":"Punctuation","behavior":"Isolated"}`), false},
		{"lowercase", withNorm(`{"type":"Lowercase"}`), false},
		{"strip_accents", withNorm(`{"type":"StripAccents"}`), false},
		{"nfkd_strip_accents", withNorm(`{"type":"Sequence","normalizers":[{"type":"NFKD"},{"type":"StripAccents"}]}`), false},
		{"nfd_strip_accents_lower", withNorm(`{"type":"Sequence","normalizers":[{"type":"NFD"},{"type":"StripAccents"},{"type":"Lowercase"}]}`), false},
		{"bert_normalizer", withNorm(`{"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":null,"lowercase":true}`), false},
		{"bert_normalizer_cased", withNorm(`{"type":"BertNormalizer","clean_text":true,"handle_chinese_chars":true,"strip_accents":true,"lowercase":false}`), false},
		{"replace_regex_dollar", withNorm(`{"type":"Replace","pattern":{"Regex":"(\\d)(\\d)"},"content":"$2$1<$0$$>"}`), false},
		{"replace_regex_empty", withNorm(`{"type":"Replace","pattern":{"Regex":"x*"},"content":"-"}`), true},
		{"replace_regex_eol", withNorm(`{"type":"Replace","pattern":{"Regex":" +$"},"content":""}`), false},
		{"replace_empty_string", withNorm(`{"type":"Replace","pattern":{"String":""},"content":"_"}`), true},
	}
	if raceEnabled {
		// Each fixture loads a 9 MB tokenizer.json, minutes under -race:
		// a quarter of them there, every one in make unit-norace
		// (NORACE_RUN), where these comparisons are the point.
		fixtures = raceSubset(fixtures)
	}
	jobs := make([]refJob, len(fixtures))
	for i, f := range fixtures {
		jobs[i] = refJob{Path: withComponents(t, "Meta-Llama-3-8B-Instruct", f.replace), Texts: fidelityTexts, NormalizeOnly: f.normalizeOnly}
	}
	ref := tokref(t, jobs)
	for i, f := range fixtures {
		t.Run(f.name, func(t *testing.T) {
			if ref[i].LoadErr != "" {
				t.Fatalf("reference: %s", ref[i].LoadErr)
			}
			tk, err := LoadFile(jobs[i].Path)
			if err != nil {
				t.Fatal(err)
			}
			for k, text := range fidelityTexts {
				r := ref[i].Results[k]
				if r.Err != "" {
					t.Fatalf("%q: reference error %s", text, r.Err)
				}
				if r.Normalized != nil && tk.normalizer != nil {
					if got := tk.normalizer.normalize(text); got != *r.Normalized {
						t.Errorf("%q: normalized %q, reference %q", text, got, *r.Normalized)
					}
				}
				if f.normalizeOnly {
					continue
				}
				if r.Pieces != nil && tk.pre != nil {
					// The reference's pieces after a ByteLevel step are in its alphabet.
					got := pieces(tk, text)
					for j, p := range got {
						if tk.byteLevel {
							got[j] = byteLevelEncodeString(p)
						}
					}
					if !slices.Equal(got, r.Pieces) {
						t.Errorf("%q: pieces %q, reference %q", text, got, r.Pieces)
					}
				}
				if got := tk.Encode(text, false); !slices.Equal(got, r.IDs) {
					d := max(firstDiff(got, r.IDs), 0)
					t.Errorf("%q: first diff at %d: got %v want %v", text, d, got[d:min(d+6, len(got))], r.IDs[d:min(d+6, len(r.IDs))])
				}
			}
		})
	}
}

func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// TestUnknownTokenMatchesReference: tokenizers fails to encode a word its
// model cannot spell when the unknown token is missing (WordPiece, WordLevel,
// Unigram without unk_id, BPE naming an unk_token absent from its
// vocabulary), where Native used to drop the word. Native refuses such a file
// (ErrUnsupported, so the ingress keys on the engine's /tokenize); with the
// unknown token present both agree.
func TestUnknownTokenMatchesReference(t *testing.T) {
	models := []struct {
		name, model string
		refuse      bool
	}{
		{"wordpiece", `{"type":"WordPiece","vocab":{"a":0,"##b":1},"unk_token":"[UNK]","continuing_subword_prefix":"##","max_input_chars_per_word":100}`, true},
		{"wordpiece_unk", `{"type":"WordPiece","vocab":{"a":0,"##b":1,"[UNK]":2},"unk_token":"[UNK]","continuing_subword_prefix":"##","max_input_chars_per_word":100}`, false},
		{"wordlevel", `{"type":"WordLevel","vocab":{"a":0,"b":1},"unk_token":"[UNK]"}`, true},
		{"wordlevel_unk", `{"type":"WordLevel","vocab":{"a":0,"b":1,"[UNK]":2},"unk_token":"[UNK]"}`, false},
		{"unigram", `{"type":"Unigram","vocab":[["a",-1],["b",-2]]}`, true},
		{"unigram_unk", `{"type":"Unigram","unk_id":2,"vocab":[["a",-1],["b",-2],["<unk>",0]]}`, false},
		{"bpe_unk_absent", `{"type":"BPE","vocab":{"a":0,"b":1},"merges":[],"unk_token":"<unk>"}`, true},
		{"bpe_no_unk", `{"type":"BPE","vocab":{"a":0,"b":1},"merges":[]}`, false},
	}
	texts := []string{"a", "a b", "ab x", "x"}
	jobs := make([]refJob, len(models))
	for i, m := range models {
		jobs[i] = refJob{Tokenizer: `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"WhitespaceSplit"},` +
			`"post_processor":null,"decoder":null,"model":` + m.model + `}`, Texts: texts}
	}
	ref := tokref(t, jobs)
	for i, m := range models {
		failed := false
		for _, r := range ref[i].Results {
			failed = failed || r.Err != ""
		}
		if failed != m.refuse {
			t.Fatalf("%s: reference fails on an unknown word: %v; the test expects %v", m.name, failed, m.refuse)
		}
		tk, err := Load([]byte(jobs[i].Tokenizer))
		if m.refuse {
			if !errors.Is(err, ErrUnsupported) {
				t.Errorf("%s: Load: %v, want ErrUnsupported", m.name, err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("%s: %v", m.name, err)
		}
		for k, text := range texts {
			if got := tk.Encode(text, false); !slices.Equal(got, ref[i].Results[k].IDs) {
				t.Errorf("%s %q: got %v want %v", m.name, text, got, ref[i].Results[k].IDs)
			}
		}
	}
}

// TestOnigTranslations pins translations whose form matters: patterns with
// nothing to translate stay as they are, Kimi's intersections become class
// subtraction, BLOOM's nested class one flat class.
func TestOnigTranslations(t *testing.T) {
	for in, want := range map[string]string{
		`\p{N}{1,3}`:                 `\p{N}{1,3}`,
		`\s+(?!\S)|\s+`:              `\s+(?!\S)|\s+`,
		`[\p{Lu}\p{M}&&[^\p{Han}]]+`: `[\p{Lu}\p{M}-[\p{Han}]]+`,
		` ?[^(\s|[.,!?…。，、।۔،])]+`:   `\ ?[^\(\s\|\.\,\!\?…。，、।۔،\)]+`,
		`\s+$`:                       `\s+(?m:$)`,
		`x{,2}`:                      `x{0,2}`,
		`a(?i)b|c`:                   `a(?:[bB]|[cC])`,
		`\d*+`:                       `(?>\d*)`,
		`(a)`:                        `(?:a)`,
	} {
		got, err := translateOnig(in)
		if err != nil || got != want {
			t.Errorf("translateOnig(%s) = %s, %v; want %s", in, got, err, want)
		}
	}
	for _, p := range refusedPatterns {
		if _, err := translateOnig(p); !errors.Is(err, ErrUnsupported) {
			t.Errorf("%s: %v, want ErrUnsupported", p, err)
		}
	}
	for _, p := range invalidPatterns {
		if _, err := translateOnig(p); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v, want ErrInvalid", p, err)
		}
	}
	if strings.Contains(TiktokenPatternKimi, "(?:(?!") {
		t.Error("Kimi's pattern is given as Kimi writes it")
	}
}
