package tokenizer

import (
	"encoding/json"
	"fmt"
	"slices"
	"testing"
)

// byteVocabJSON is a byte-level BPE's vocabulary without merges: each
// byte its own id.
func byteVocabJSON() []byte {
	vocab := map[string]int{}
	for b := range 256 {
		vocab[string(byteToRune[b])] = b
	}
	v, _ := json.Marshal(vocab)
	return v
}

// addedMatchJSON is a byte-level BPE without merges (each byte its own id)
// with added tokens that overlap the way find_matches makes them: an rstrip
// token followed by whitespace tokens, an lstrip one, and single_word tokens
// that contain a shorter token.
func addedMatchJSON() string {
	v := byteVocabJSON()
	tok := func(id int, content string, singleWord, lstrip, rstrip, special bool) string {
		c, _ := json.Marshal(content)
		return fmt.Sprintf(`{"id":%d,"content":%s,"single_word":%v,"lstrip":%v,"rstrip":%v,"normalized":false,"special":%v}`,
			id, c, singleWord, lstrip, rstrip, special)
	}
	added := []string{
		tok(256, "</think>", false, false, true, true), tok(257, "\n\n", false, false, false, true),
		tok(258, "<x>", false, true, false, true), tok(259, "  ", false, false, false, false),
		tok(260, "xy", true, false, false, false), tok(261, "yq", false, false, false, false),
		tok(262, "xyqr", true, false, false, false),
	}
	out := `{"version":"1.0","added_tokens":[`
	for i, a := range added {
		if i > 0 {
			out += ","
		}
		out += a
	}
	return out + `],"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},` +
		`"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},` +
		`"model":{"type":"BPE","vocab":` + string(v) + `,"merges":[]}}`
}

// addedMatchCases are texts for addedMatchJSON with the ids tokenizers
// 0.23.2 gives (TestAddedTokenMatchesReference checks them against it).
var addedMatchCases = []idCase{
	// rstrip reaches over the whitespace, whose added tokens are still
	// emitted after it; a "\n" left over is text again.
	{"</think>\n\nok", []uint32{256, 257, 111, 107}},
	{"</think>\n\n\n\nok", []uint32{256, 257, 257, 111, 107}},
	{"</think> \n\nok", []uint32{256, 257, 111, 107}},
	{"</think>\n\n\nok", []uint32{256, 257, 10, 111, 107}},
	{"</think>\n\n</think>\n\nz", []uint32{256, 257, 256, 257, 122}},
	{" \n\n</think>\n\n", []uint32{32, 257, 256, 257}},
	// lstrip does not take back spaces an earlier piece took.
	{"</think>  <x>b", []uint32{256, 259, 258, 98}},
	{"</think>   <x>b", []uint32{256, 259, 258, 98}},
	{"a  <x>b", []uint32{97, 259, 258, 98}},
	// A single_word token glued to a word is dropped with its span: no
	// shorter token is looked for inside it.
	{"axyq", []uint32{97, 120, 121, 113}},
	{"axyqr", []uint32{97, 120, 121, 113, 114}},
	{"xyq", []uint32{120, 121, 113}},
	{"xy q", []uint32{260, 32, 113}},
	{"a xyqr yq", []uint32{97, 32, 262, 32, 261}},
}

// TestAddedTokenMatches: added tokens are found as tokenizers' find_matches
// finds them (h-tok finding 2: Native hid the "\n\n" after an rstrip
// "</think>", and tried shorter tokens inside a single_word token it refused).
func TestAddedTokenMatches(t *testing.T) { checkIDs(t, addedMatchJSON(), addedMatchCases) }

// TestAddedTokenMatchesReference holds addedMatchCases to tokenizers.
func TestAddedTokenMatchesReference(t *testing.T) {
	checkIDsReference(t, addedMatchJSON(), addedMatchCases)
}

// idCase is a text and the ids tokenizers 0.23.2 gives it (no special
// tokens added).
type idCase struct {
	text string
	want []uint32
}

// checkIDs encodes each case's text with the tokenizer in js.
func checkIDs(t *testing.T, js string, cases []idCase) {
	t.Helper()
	tk := mustLoad(t, js)
	for _, c := range cases {
		if got := tk.Encode(c.text, false); !slices.Equal(got, c.want) {
			t.Errorf("%q: got %v want %v", c.text, got, c.want)
		}
	}
}

// checkIDsReference holds the cases' expected ids to tokenizers itself.
func checkIDsReference(t *testing.T, js string, cases []idCase) {
	t.Helper()
	job := refJob{Tokenizer: js}
	for _, c := range cases {
		job.Texts = append(job.Texts, c.text)
	}
	ref := tokref(t, []refJob{job})[0]
	if ref.LoadErr != "" {
		t.Fatalf("reference: %s", ref.LoadErr)
	}
	for i, c := range cases {
		if r := ref.Results[i]; r.Err != "" || !slices.Equal(r.IDs, c.want) {
			t.Errorf("%q: test expects %v, reference %v %s", c.text, c.want, r.IDs, r.Err)
		}
	}
}

// normalizedSpecialJSON: addedMatchJSON's byte-level model under a Lowercase
// normalizer, with a special token marked normalized (as CLIP's
// <|startoftext|> is).
func normalizedSpecialJSON() string {
	v := byteVocabJSON()
	return `{"version":"1.0","added_tokens":[` +
		`{"id":256,"content":"<|startoftext|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":true},` +
		`{"id":257,"content":"<|END|>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true}],` +
		`"normalizer":{"type":"Lowercase"},"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},` +
		`"post_processor":null,"decoder":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},` +
		`"model":{"type":"BPE","vocab":` + string(v) + `,"merges":[]}}`
}

// normalizedSpecialCases are texts for normalizedSpecialJSON with the ids
// tokenizers 0.23.2 gives: a special token marked normalized is matched on
// the normalized (lowercased) text, one that is not on the raw text.
var normalizedSpecialCases = []idCase{
	{"<|STARTOFTEXT|>A", []uint32{256, 97}},
	{"<|startoftext|>", []uint32{256}},
	{"<|END|>x", []uint32{257, 120}},
	{"<|end|>", []uint32{60, 124, 101, 110, 100, 124, 62}},
}

// TestNormalizedSpecialToken: a special token's normalized flag is obeyed
// (tokenizers partitions added tokens by it alone); before, special tokens
// were always matched on the raw text, so "<|STARTOFTEXT|>" under CLIP's
// Lowercase normalizer gave 15 byte ids instead of the token.
func TestNormalizedSpecialToken(t *testing.T) {
	checkIDs(t, normalizedSpecialJSON(), normalizedSpecialCases)
}

// TestNormalizedSpecialTokenReference holds normalizedSpecialCases to
// tokenizers.
func TestNormalizedSpecialTokenReference(t *testing.T) {
	checkIDsReference(t, normalizedSpecialJSON(), normalizedSpecialCases)
}
