package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/internal/tokenizer/hfref"
)

// The component tests below hold Native to the Hugging Face tokenizers
// library (the npm binding of its Rust core, the version hfref pins) on small
// tokenizer.json files built in the test: for each file and text the
// reference's ids (or its error), its pre-tokenization and its normalized
// string.

const tokrefScript = `import { Tokenizer } from "tokenizers";
import { readFileSync } from "node:fs";
const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const out = [];
for (const job of jobs) {
  let t;
  try {
    t = Tokenizer.fromString(job.path ? readFileSync(job.path, "utf8") : job.tokenizer);
  } catch (e) {
    out.push({ loadErr: String(e) || "error" });
    continue;
  }
  const pre = t.getPreTokenizer(), norm = t.getNormalizer();
  const results = [];
  for (const s of job.texts) {
    const r = {};
    if (!job.normalizeOnly) {
      try {
        r.ids = (await t.encode(s, null, { addSpecialTokens: false })).getIds();
      } catch (e) {
        r.err = String(e) || "error";
      }
    }
    if (pre) r.pieces = pre.preTokenizeString(s).map((p) => p[0]);
    if (norm) r.normalized = norm.normalizeString(s);
    results.push(r);
  }
  out.push({ results });
}
process.stdout.write(JSON.stringify(out));
`

// refJob is one tokenizer (inline JSON, or a file for large ones) and texts.
// normalizeOnly skips encoding (tokenizers 0.23.2 panics encoding some texts
// after a Replace whose regex matches empty strings; its normalizer is fine).
type refJob struct {
	Tokenizer     string   `json:"tokenizer,omitempty"`
	Path          string   `json:"path,omitempty"`
	Texts         []string `json:"texts"`
	NormalizeOnly bool     `json:"normalizeOnly,omitempty"`
}

type refResult struct {
	IDs        []uint32 `json:"ids"`
	Err        string   `json:"err"`
	Pieces     []string `json:"pieces"`
	Normalized *string  `json:"normalized"`
}

type refOutput struct {
	LoadErr string      `json:"loadErr"`
	Results []refResult `json:"results"`
}

// tokref runs the jobs through the reference in one node process.
func tokref(tb testing.TB, jobs []refJob) []refOutput {
	tb.Helper()
	dir := testutil.NPMPackages(tb, "tokref-"+hfref.Version,
		"the Hugging Face tokenizers library is the reference encoder",
		[]string{"tokenizers@" + hfref.Version}, map[string]string{"tokref.mjs": tokrefScript})
	var out []refOutput
	testutil.RunNode(tb, dir, "tokref.mjs", nil, jobs, &out, 3*time.Minute)
	if len(out) != len(jobs) {
		tb.Fatalf("tokref: %d results for %d jobs", len(out), len(jobs))
	}
	return out
}

// withComponents returns the tokenizer.json of the named test-data file (see
// tokenizerDataDir) with some top-level members replaced (raw JSON; "null"
// removes a component), written to a temporary file.
func withComponents(tb testing.TB, base string, replace map[string]string) string {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(tokenizerDataDir(tb), base+".json"))
	if err != nil {
		tb.Fatal(err)
	}
	var f map[string]json.RawMessage
	if err := json.Unmarshal(b, &f); err != nil {
		tb.Fatal(err)
	}
	for k, v := range replace {
		f[k] = json.RawMessage(v)
	}
	out, err := json.Marshal(f)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), base+".json")
	if err := os.WriteFile(path, out, 0o644); err != nil {
		tb.Fatal(err)
	}
	return path
}

// fidelityTexts are the texts every component fixture is checked on: the
// findings' repros and the characters where the Unicode tables of Go and of
// the reference's crates part (see normalizers.go), plus plain text.
var fidelityTexts = []string{
	"Hello world, this is a test.", "Привет, как дела? Хорошо.", "x² ½ Ⅻ ³ ¹²³ ৴ ⅷ", "Ⅱ Ⓜ xⅡy aⓂb word\u200cjoin\u200dx_y",
	"ΣΑΣ σας ΟΔΟΣ. İstanbul", "हिन्दी देवनागरी", "naïve café Ǆemal e\u0301 \u1e9b\u0323 Å", "北京 𫠠𫠡 𫡀 日本語のテキスト",
	"I'm THEY'RE we'll 'S", "1234567 3.14159 ①②", "def f(x):\n    return x**2\n", "  trailing \t\n",
	"punct: ؝ ৽ ᙭ 𑇉 ⹃ ¿¡ «» — …", "marks: a\u1734 a\u1885 a\u0890 a\u08e2 a\U000110cd a\u1cf2 a\u08d4 a\ua9bd",
	"ctrl:\x00\x01\u200b\ufeff\u00ad\ufffd\ue000 end", "𝕏 ﬁ ㎏ ℌ", "",
}
