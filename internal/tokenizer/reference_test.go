package tokenizer

import (
	"encoding/json"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/tokenizer/hfjinja"
	"github.com/kvmesh/kvmesh/internal/tokenizer/hfref"
)

// TestReferenceModels encodes the same texts with the native tokenizer and
// with the Hugging Face tokenizers library (its Rust core through the Node
// binding) on real tokenizer files of 19 model families (hfref.Models), with
// and without special tokens, and renders chats with each model's own chat
// template against @huggingface/jinja. Unlike TestGolden, whose three files
// were chosen with the code, these families were not looked at while writing
// it (they were added after, as held-out checks).
func TestReferenceModels(t *testing.T) {
	texts := referenceTexts(t)
	models := hfref.Models
	if raceEnabled {
		models = raceSubset(models) // the rest in make unit-norace (NORACE_RUN)
	}
	for _, model := range models {
		t.Run(model, func(t *testing.T) {
			dir := hfref.ModelDir(t, model)
			tk, ct, err := LoadDir(dir)
			if err != nil {
				t.Fatal(err)
			}
			ref := hfref.Encode(t, filepath.Join(dir, "tokenizer.json"), texts)
			bad := 0
			for i, text := range texts {
				for _, special := range []bool{false, true} {
					want := ref[i].Plain
					if special {
						want = ref[i].Special
					}
					got := tk.Encode(text, special)
					if d := firstDiff(got, want); d >= 0 {
						if bad++; bad <= 5 {
							lo := max(0, d-3)
							t.Errorf("text %d special=%v: first diff at %d: got %v want %v (text %.80q)",
								i, special, d, got[lo:min(d+4, len(got))], want[lo:min(d+4, len(want))], text)
						}
					}
				}
			}
			if bad > 5 {
				t.Errorf("%d encodings differ in all", bad)
			}
			checkReferenceChat(t, dir, ct)
		})
	}
}

// checkReferenceChat renders conversations with the model's chat template
// (nil when tokenizer_config.json has none) and with @huggingface/jinja.
func checkReferenceChat(t *testing.T, dir string, ct *ChatTemplate) {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	if ct == nil {
		if !isNull(cfg["chat_template"]) {
			t.Fatal("tokenizer_config.json has a chat_template but LoadDir returned none")
		}
		return
	}
	src, err := templateSource(cfg["chat_template"])
	if err != nil {
		t.Fatal(err)
	}
	specials := map[string]string{}
	for _, k := range specialTokenKeys {
		if s, ok := tokenContent(cfg[k]); ok {
			specials[k] = s
		}
	}
	convs := []string{
		`[{"role":"user","content":"Hello!"}]`,
		`[{"role":"system","content":"You are terse."},{"role":"user","content":"2+2?"},{"role":"assistant","content":"4"},{"role":"user","content":"and 3+3?"}]`,
		`[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":"  spaces \n newline  "}]`,
		`[{"role":"system","content":"S"},{"role":"user","content":"日本語 🙂 <b>tags</b> {{ not jinja }}"}]`,
	}
	jobs := make([]hfjinja.Job, len(convs))
	for i, c := range convs {
		vars := map[string]any{"add_generation_prompt": true, "messages": json.RawMessage(c)}
		for k, v := range specials {
			vars[k] = v
		}
		vb, err := json.Marshal(vars)
		if err != nil {
			t.Fatal(err)
		}
		jobs[i] = hfjinja.Job{Template: src, Vars: vb}
	}
	ref := hfjinja.Render(t, jobs)
	for i, c := range convs {
		got, err := ct.RenderJSON([]byte(c), true, nil)
		if (err != nil) != (ref[i].Err != "") {
			t.Errorf("conversation %d: error %v, reference error %q", i, err, ref[i].Err)
			continue
		}
		if got != ref[i].Out {
			t.Errorf("conversation %d: rendered\n%q\nreference\n%q", i, got, ref[i].Out)
		}
	}
}

// referenceTexts is golden.json's texts, edge cases of Unicode, whitespace and
// markup, 300 random strings drawn from those pieces (seeded), and, outside
// -race, long_text.txt.
func referenceTexts(t *testing.T) []string {
	var texts []string
	for _, c := range loadGolden(t, modelNames[0]).Cases {
		texts = append(texts, c.Text)
	}
	pieces := []string{
		" ", "  ", "\n", "\n\n", "\t", "\r\n", "a", "Z", "é", "ß", "中", "文", "の", "한", "🙂", "👩\u200d👩\u200d👧",
		"\u0301", "1", "23", "456", "7890", ".", ",", "'s", "'S", "n't", "'ll", "<|im_start|>", "<|im_end|>",
		"<s>", "</s>", "<bos>", "<start_of_turn>", "[INST]", "▁", "\u00a0", "\u3000", "ｱ", "Ⅻ", "ﬁ", "½", "$", "{",
		"}", "<", ">", "\\", "_", "-", "--", "...", "ı", "İ", "ǅ", "ΣΑΣ", "σας", "Hello", " world", "\x00", "\x7f",
		"\ufeff", "\u200b", "\u2028", "def f(x):\n    return x**2", "日本語のテキスト", "한국어", "naïve café",
		strings.Repeat("x", 40), strings.Repeat(" ", 17), strings.Repeat("=", 9),
	}
	rng := rand.New(rand.NewPCG(16, 2026))
	for range 300 {
		var b strings.Builder
		for range 1 + rng.IntN(40) {
			b.WriteString(pieces[rng.IntN(len(pieces))])
		}
		texts = append(texts, b.String())
	}
	texts = append(texts, "", " ", "x")
	if !raceEnabled {
		texts = append(texts, longText(t))
	}
	return texts
}

// raceSubset keeps every fourth case (the first included) of a list whose
// cases each cost minutes under -race; `make unit-norace` runs them all
// (its NORACE_RUN names the tests that use it).
func raceSubset[T any](all []T) []T {
	var out []T
	for i := 0; i < len(all); i += 4 {
		out = append(out, all[i])
	}
	return out
}
