package tokenizer

import (
	"encoding/json"
	"testing"
)

// TestDecodeAsTokenizers: Decode gives what tokenizers 0.23.2's decode gives
// (recorded from its Node binding): without a decoder the tokens are joined
// with spaces (Native concatenated them); the Metaspace decoder drops every
// "▁" of the first token and keeps its literal spaces, so an added token
// " the end" keeps its space (Native stripped it); a normalized added token
// decodes as its normalized content; a byte-level model without a ByteLevel
// decoder step gives its tokens in the byte-level alphabet (h-tok finding 5).
func TestDecodeAsTokenizers(t *testing.T) {
	wordLevel := func(decoder, normalizer string) string {
		return `{"version":"1.0","added_tokens":[
			{"id":3,"content":"<s>","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":true},
			{"id":4,"content":" the end","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":false},
			{"id":5,"content":"[USR]","single_word":false,"lstrip":false,"rstrip":false,"normalized":true,"special":false},
			{"id":6,"content":"▁x","single_word":false,"lstrip":false,"rstrip":false,"normalized":false,"special":false}],
			"normalizer":` + normalizer + `,"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":null,"decoder":` + decoder + `,
			"model":{"type":"WordLevel","vocab":{"[UNK]":0,"▁a":1,"b":2},"unk_token":"[UNK]"}}`
	}
	const metaspace = `{"type":"Metaspace","replacement":"▁","prepend_scheme":"always","split":true}`
	byteVocab := map[string]int{"Ġb": 256}
	for b := range 256 {
		byteVocab[string(byteToRune[b])] = b
	}
	bv, _ := json.Marshal(byteVocab)
	byteLevel := `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":true},` +
		`"post_processor":null,"decoder":null,"model":{"type":"BPE","vocab":` + string(bv) + `,"merges":[["Ġ","b"]]}}`
	cases := []struct {
		name, json string
		ids        []uint32
		want       string // skipSpecialTokens false
		wantSkip   string
	}{
		{"no decoder", wordLevel("null", "null"), []uint32{1, 2, 3, 1, 2}, "▁a b <s> ▁a b", "▁a b ▁a b"},
		{"no decoder, added token with a space", wordLevel("null", "null"), []uint32{1, 4, 1}, "▁a  the end ▁a", "▁a  the end ▁a"},
		{"no decoder, specials only", wordLevel("null", "null"), []uint32{3, 3}, "<s> <s>", ""},
		{"metaspace, added token with a space first", wordLevel(metaspace, "null"), []uint32{4, 1}, " the end a", " the end a"},
		{"metaspace, added token with a space", wordLevel(metaspace, "null"), []uint32{1, 4, 1}, "a the end a", "a the end a"},
		{"metaspace, special", wordLevel(metaspace, "null"), []uint32{1, 2, 3, 1, 2}, "ab<s> ab", "ab ab"},
		{"metaspace, first token's replacement", wordLevel(metaspace, "null"), []uint32{6, 1}, "x a", "x a"},
		{"normalized added token", wordLevel("null", `{"type":"Lowercase"}`), []uint32{1, 5, 2}, "▁a [usr] b", "▁a [usr] b"},
		{"byte-level without decoder", byteLevel, []uint32{97, 256}, "a Ġb", "a Ġb"},
		{"byte-level without decoder, split character", byteLevel, []uint32{0xc3, 0xbc}, "Ã ¼", "Ã ¼"},
	}
	for _, c := range cases {
		tk := mustLoad(t, c.json)
		if got := tk.Decode(c.ids, false); got != c.want {
			t.Errorf("%s: Decode(%v, false) = %q, want %q", c.name, c.ids, got, c.want)
		}
		if got := tk.Decode(c.ids, true); got != c.wantSkip {
			t.Errorf("%s: Decode(%v, true) = %q, want %q", c.name, c.ids, got, c.wantSkip)
		}
	}
	// The Metaspace decoder on tokens of the model: every "▁" of the first
	// token goes, literal spaces stay.
	tk := mustLoad(t, `{"version":"1.0","added_tokens":[],"normalizer":null,"pre_tokenizer":{"type":"WhitespaceSplit"},"post_processor":null,`+
		`"decoder":`+metaspace+`,"model":{"type":"WordLevel","vocab":{"[UNK]":0,"a▁b":1,"▁▁c":2," d":3},"unk_token":"[UNK]"}}`)
	for _, c := range []struct {
		ids  []uint32
		want string
	}{{[]uint32{1, 2}, "ab  c"}, {[]uint32{2, 1}, "ca b"}, {[]uint32{3, 1}, " da b"}} {
		if got := tk.Decode(c.ids, false); got != c.want {
			t.Errorf("metaspace: Decode(%v) = %q, want %q", c.ids, got, c.want)
		}
	}
}
