package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

func mustLoad(t *testing.T, js string) *Native {
	t.Helper()
	tk, err := Load([]byte(js))
	if err != nil {
		t.Fatalf("load: %v", err)
	}
	return tk
}

// TestSplitBehaviors uses the example of the tokenizers documentation
// (pattern "-" on "the-final--countdown").
func TestSplitBehaviors(t *testing.T) {
	s := "the-final--countdown"
	ms := literalMatcher("-").appendMatches(nil, s)
	cases := []struct {
		beh  splitBehavior
		want []string
	}{
		{behRemoved, []string{"the", "final", "countdown"}},
		{behIsolated, []string{"the", "-", "final", "-", "-", "countdown"}},
		{behMergedWithPrevious, []string{"the-", "final-", "-", "countdown"}},
		{behMergedWithNext, []string{"the", "-final", "-", "-countdown"}},
		{behContiguous, []string{"the", "-", "final", "--", "countdown"}},
	}
	for _, c := range cases {
		if got := applyBehavior(nil, s, ms, c.beh, false); !slices.Equal(got, c.want) {
			t.Errorf("behavior %d: got %q want %q", c.beh, got, c.want)
		}
	}
	// invert: the pieces between dashes are the matches.
	if got := applyBehavior(nil, s, ms, behRemoved, true); !slices.Equal(got, []string{"-", "-", "-"}) {
		t.Errorf("inverted removed: got %q", got)
	}
}

func TestAddedTokenFlags(t *testing.T) {
	toks := []*addedToken{
		{id: 1, content: "<l>", lstrip: true},
		{id: 2, content: "<r>", rstrip: true},
		{id: 3, content: "tok", singleWord: true},
		{id: 4, content: "<longer>"},
		{id: 5, content: "<long"},
	}
	v := newAddedVocab(toks, nil)
	text := "a  <l>b<r>  c tok xtoky <longer>"
	var got []string
	for _, p := range v.split(nil, text) {
		s := text[p.start:p.end]
		if p.id >= 0 {
			s = "#" + s
		}
		got = append(got, s)
	}
	want := []string{"a", "#  <l>", "b", "#<r>  ", "c ", "#tok", " xtoky ", "#<longer>"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %q\nwant %q", got, want)
	}
}

func TestUnigramMetaspace(t *testing.T) {
	tk := mustLoad(t, `{
		"model": {"type": "Unigram", "unk_id": 0, "vocab": [["<unk>", 0], ["▁", -1], ["a", -2], ["b", -2], ["ab", -1], ["▁ab", -0.5]]},
		"pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
		"decoder": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always"}}`)
	if got := tk.Encode("ab ab", false); !slices.Equal(got, []uint32{5, 5}) {
		t.Errorf("ab ab: %v", got)
	}
	// "c" is unknown: ▁ + a + <unk> beats nothing else.
	if got := tk.Encode("ac", false); !slices.Equal(got, []uint32{1, 2, 0}) {
		t.Errorf("ac: %v", got)
	}
	if got := tk.Decode([]uint32{5, 5}, false); got != "ab ab" {
		t.Errorf("decode: %q", got)
	}
}

func TestBPEByteFallbackAndUnk(t *testing.T) {
	tk := mustLoad(t, `{
		"model": {"type": "BPE", "byte_fallback": true, "unk_token": "<unk>", "fuse_unk": true,
			"vocab": {"<unk>": 0, "a": 1, "b": 2, "ab": 3, "<0xC3>": 4, "<0xA9>": 5},
			"merges": [["a", "b"]]},
		"pre_tokenizer": {"type": "WhitespaceSplit"},
		"decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}, {"type": "Fuse"}]}}`)
	ids := tk.Encode("ab é", false)
	if !slices.Equal(ids, []uint32{3, 4, 5}) {
		t.Fatalf("ids %v", ids)
	}
	if got := tk.Decode(ids, false); got != "abé" {
		t.Errorf("decode %q", got)
	}
	if got := tk.Decode([]uint32{4}, false); got != "\uFFFD" {
		t.Errorf("lone byte decodes to %q", got)
	}
	// No fallback token for 'x': unknown, and consecutive unknowns fuse.
	if got := tk.Encode("axxb", false); !slices.Equal(got, []uint32{1, 0, 2}) {
		t.Errorf("unk: %v", got)
	}
}

func TestWordPieceDecodeCleanup(t *testing.T) {
	tk := loadNamed(t, "bert-base-uncased")
	ids := tk.Encode("Hello, world! I'm here.", true)
	// tokenizers' cleanup joins " ," and " !" but leaves " ' " split by
	// BertPreTokenizer as " ' m" (a known quirk of the reference).
	if got := tk.Decode(ids, true); got != "hello, world! i ' m here." {
		t.Errorf("decode: %q", got)
	}
	if got := tk.Decode(ids, false); !strings.HasPrefix(got, "[CLS] hello") || !strings.HasSuffix(got, "[SEP]") {
		t.Errorf("decode with specials: %q", got)
	}
}

// TestDecodeRoundTrip: byte-level BPE is lossless on every golden text; with
// special tokens kept, the post-processor's BOS comes back too.
func TestDecodeRoundTrip(t *testing.T) {
	tk := loadNamed(t, "Meta-Llama-3-8B-Instruct")
	for i, c := range loadGolden(t, "Meta-Llama-3-8B-Instruct").Cases {
		if got := tk.Decode(c.IDsPlain, false); got != c.Text {
			t.Fatalf("case %d: decode differs", i)
		}
		if got := tk.Decode(c.IDsSpecial, false); got != "<|begin_of_text|>"+c.Text {
			t.Fatalf("case %d: decode with specials differs", i)
		}
		want := c.Text
		for _, sp := range []string{"<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|end_of_text|>"} {
			want = strings.ReplaceAll(want, sp, "")
		}
		if got := tk.Decode(c.IDsSpecial, true); got != want {
			t.Fatalf("case %d: skip specials: got %.60q want %.60q", i, got, want)
		}
	}
}

func TestLookups(t *testing.T) {
	tk := loadNamed(t, "Meta-Llama-3-8B-Instruct")
	ids := tk.Encode("Hello world<|eot_id|>", false)
	if len(ids) != 3 {
		t.Fatalf("ids %v", ids)
	}
	if tok, ok := tk.IDToToken(ids[1]); !ok || tok != "Ġworld" {
		t.Errorf("IDToToken(%d) = %q", ids[1], tok)
	}
	if id, ok := tk.TokenToID("Ġworld"); !ok || id != ids[1] {
		t.Errorf("TokenToID(Ġworld) = %d", id)
	}
	if id, ok := tk.TokenToID("<|eot_id|>"); !ok || id != ids[2] || !tk.IsSpecial(id) {
		t.Errorf("TokenToID(<|eot_id|>) = %d", id)
	}
	if tk.VocabSize() != 128256 {
		t.Errorf("vocab size %d", tk.VocabSize())
	}
	if _, ok := tk.IDToToken(1 << 30); ok {
		t.Error("IDToToken accepted an out-of-range id")
	}
}

// TestRustLowercase: per character, as NormalizedString::lowercase (no
// final sigma: the reference lowercases "ΣΑΣ" to "σασ"; TestComponentsMatchReference
// checks it against the reference).
func TestRustLowercase(t *testing.T) {
	for in, want := range map[string]string{"İ": "i\u0307", "ΟΔΟΣ": "οδοσ", "ΣΑΣ σας": "σασ σας", "ΣΑ": "σα", "ABC": "abc"} {
		if got := rustLower(in); got != want {
			t.Errorf("rustLower(%q) = %q want %q", in, got, want)
		}
	}
}

func TestLoadErrors(t *testing.T) {
	cases := map[string]error{
		`not json`:        ErrInvalid,
		`{"model": null}`: ErrInvalid,
		`{"model": {"type": "Mystery", "vocab": {}}}`:                                                                                          ErrUnsupported,
		`{"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}}`:                                                                     ErrInvalid,
		`{"model": {"type": "WordLevel", "vocab": {}}, "normalizer": {"type": "Precompiled"}}`:                                                 ErrUnsupported,
		`{"model": {"type": "WordLevel", "vocab": {}}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "("}, "behavior": "Isolated"}}`: ErrInvalid,
		// Oniguruma takes these; Native does not translate them (the ingress
		// then keys the model on the engine's /tokenize instead of exiting).
		`{"model": {"type": "WordLevel", "vocab": {}}, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "\\p{Emoji}"}, "behavior": "Isolated"}}`: ErrUnsupported,
		`{"model": {"type": "WordLevel", "vocab": {}}, "normalizer": {"type": "Replace", "pattern": {"Regex": "(a)\\1"}, "content": ""}}`:               ErrUnsupported,
		`{"model": {"type": "WordPiece", "vocab": {"a": 0}}}`: ErrUnsupported,
	}
	for js, want := range cases {
		if _, err := Load([]byte(js)); !errors.Is(err, want) {
			t.Errorf("%s: got %v want %v", js, err, want)
		}
	}
}

func TestLoadDir(t *testing.T) {
	dir := t.TempDir()
	if _, _, err := LoadDir(dir); err == nil {
		t.Fatal("empty dir accepted")
	}
	data := tokenizerDataDir(t)
	if err := os.Symlink(filepath.Join(data, "bert-base-uncased.json"), filepath.Join(dir, "tokenizer.json")); err != nil {
		t.Fatal(err)
	}
	tk, ct, err := LoadDir(dir)
	if err != nil || tk == nil || ct != nil {
		t.Fatalf("without config: %v %v %v", tk, ct, err)
	}
	if err := os.Symlink(filepath.Join(data, "meta-llama-3-8b-instruct", "tokenizer_config.json"), filepath.Join(dir, "tokenizer_config.json")); err != nil {
		t.Fatal(err)
	}
	if _, ct, err = LoadDir(dir); err != nil || ct == nil {
		t.Fatalf("with config: %v %v", ct, err)
	}
}

// TestLlama2Style: the SentencePiece-BPE layout of Llama 2 / Mistral files
// (Prepend + Replace normalizer, no pre-tokenizer, byte fallback, and the
// Replace/ByteFallback/Fuse/Strip decoder chain).
func TestLlama2Style(t *testing.T) {
	tk := mustLoad(t, `{
		"added_tokens": [{"id": 1, "content": "<s>", "special": true}],
		"normalizer": {"type": "Sequence", "normalizers": [
			{"type": "Prepend", "prepend": "▁"},
			{"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
		"pre_tokenizer": null,
		"post_processor": {"type": "TemplateProcessing",
			"single": [{"SpecialToken": {"id": "<s>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
			"special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
		"decoder": {"type": "Sequence", "decoders": [
			{"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
			{"type": "ByteFallback"}, {"type": "Fuse"},
			{"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
		"model": {"type": "BPE", "byte_fallback": true, "fuse_unk": true, "unk_token": "<unk>",
			"vocab": {"<unk>": 0, "<s>": 1, "▁": 2, "h": 3, "i": 4, "▁h": 5, "▁hi": 6, "<0x21>": 7},
			"merges": ["▁ h", "▁h i"]}}`)
	ids := tk.Encode("hi! hi", true)
	want := []uint32{1, 6, 7, 6}
	if !slices.Equal(ids, want) {
		t.Fatalf("ids %v want %v", ids, want)
	}
	if got := tk.Decode(ids, true); got != "hi! hi" {
		t.Errorf("decode %q", got)
	}
	if tk.prefixSafe {
		t.Error("a Prepend normalizer must disable the prefix cache")
	}
}

// TestLoadChatTemplateDir: a model directory's template is found where
// transformers and vLLM look, first found wins: chat_template.jinja, a
// processor's chat_template.json, tokenizer_config.json; the special tokens
// always come from tokenizer_config.json; a directory without any has none.
func TestLoadChatTemplateDir(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	render := func(ct *ChatTemplate) string {
		t.Helper()
		if ct == nil {
			return "<none>"
		}
		s, err := ct.Render([]Message{{Role: "user", Content: "hi"}}, false)
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	check := func(want string) {
		t.Helper()
		ct, err := LoadChatTemplateDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		if got := render(ct); got != want {
			t.Fatalf("got %q, want %q", got, want)
		}
		// A path to the directory loads the same (an empty one is an error).
		if ct2, err := LoadChatTemplateFile(dir); (ct == nil) != (err != nil) || render(ct2) != want && ct != nil {
			t.Fatalf("LoadChatTemplateFile(dir): %v %q", err, render(ct2))
		}
	}
	check("<none>")
	write("tokenizer_config.json", `{"bos_token":"<s>"}`)
	check("<none>")
	write("tokenizer_config.json", `{"bos_token":"<s>","chat_template":"{{ bos_token }}config:{{ messages[0].content }}"}`)
	check("<s>config:hi")
	write("chat_template.json", `{"chat_template":"{{ bos_token }}processor:{{ messages[0].content }}"}`)
	check("<s>processor:hi")
	write("chat_template.jinja", "{{ bos_token }}jinja:{{ messages[0].content }}")
	check("<s>jinja:hi")
	// A Jinja file named on its own takes the special tokens beside it.
	ct, err := LoadChatTemplateFile(filepath.Join(dir, "chat_template.jinja"))
	if err != nil || render(ct) != "<s>jinja:hi" {
		t.Fatalf("the .jinja file: %q %v", render(ct), err)
	}
	write("chat_template.json", `{"chat_template":7}`)
	if _, err := LoadChatTemplateDir(dir); err != nil {
		t.Fatalf("chat_template.jinja wins before a malformed chat_template.json is read: %v", err)
	}
}
