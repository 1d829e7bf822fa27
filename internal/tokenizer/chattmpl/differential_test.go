package chattmpl_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/tokenizer/chattmpl"
	"github.com/kvmesh/kvmesh/internal/tokenizer/hfjinja"
)

// templateDir holds real chat templates; SOURCES.md there names each origin.
const templateDir = "../../../testdata/tokenizer/templates"

// diffTools is an OpenAI tools array (nested JSON schema, enum, required).
const diffTools = `[{"type":"function","function":{"name":"get_weather","description":"Get the weather for a city.","parameters":{"type":"object","properties":{"city":{"type":"string","description":"City name"},"unit":{"type":"string","enum":["celsius","fahrenheit"]}},"required":["city"]}}},` +
	`{"type":"function","function":{"name":"search","description":"Search the web.","parameters":{"type":"object","properties":{"q":{"type":"string"},"n":{"type":"integer"}},"required":["q"]}}}]`

// DiffCase is one conversation; Vars is the template's variables as a JSON
// object, exactly what a chat-completions request hands the template.
type diffCase struct {
	name string
	vars string
}

// diffCases cover what users send: plain and multi-turn chats, tools, tool
// calls with object and with string arguments, parallel calls, tool results,
// multi-part content (text and image parts), reasoning_content, thinking
// switched off, and both settings of add_generation_prompt.
var diffCases = []diffCase{
	{"plain", `{"messages":[{"role":"user","content":"Hello there!"}],"add_generation_prompt":true}`},
	{"system multi-turn", `{"messages":[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello."},{"role":"user","content":"  Tell me a joke. "}],"add_generation_prompt":true}`},
	{"no generation prompt", `{"messages":[{"role":"system","content":"S"},{"role":"user","content":"Q"},{"role":"assistant","content":"A"}],"add_generation_prompt":false}`},
	{"tools", `{"messages":[{"role":"system","content":"Use tools."},{"role":"user","content":"Weather in Paris?"}],"tools":` + diffTools + `,"add_generation_prompt":true}`},
	{"tools no system", `{"messages":[{"role":"user","content":"Weather in Paris?"}],"tools":` + diffTools + `,"add_generation_prompt":true}`},
	{"tool call object args", `{"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","tool_calls":[{"id":"call_abc123456","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris","unit":"celsius"}}}]},{"role":"tool","tool_call_id":"call_abc123456","content":"{\"temp\": 21}"},{"role":"user","content":"Thanks"}],"tools":` + diffTools + `,"add_generation_prompt":true}`},
	{"tool call string args", `{"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":"","tool_calls":[{"id":"call_abc123456","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_abc123456","content":"21 C"}],"tools":` + diffTools + `,"add_generation_prompt":true}`},
	{"parallel tool calls", `{"messages":[{"role":"user","content":"Weather in Paris and Rome?"},{"role":"assistant","content":"","tool_calls":[{"id":"call_aaaaaaaa1","type":"function","function":{"name":"get_weather","arguments":{"city":"Paris"}}},{"id":"call_aaaaaaaa2","type":"function","function":{"name":"get_weather","arguments":{"city":"Rome"}}}]},{"role":"tool","tool_call_id":"call_aaaaaaaa1","content":"21"},{"role":"tool","tool_call_id":"call_aaaaaaaa2","content":"25"}],"tools":` + diffTools + `,"add_generation_prompt":true}`},
	{"multi-part text", `{"messages":[{"role":"system","content":[{"type":"text","text":"Be brief."}]},{"role":"user","content":[{"type":"text","text":"Part one."},{"type":"text","text":"Part two."}]}],"add_generation_prompt":true}`},
	{"multi-part image", `{"messages":[{"role":"user","content":[{"type":"image"},{"type":"text","text":"What is in this picture?"}]}],"add_generation_prompt":true}`},
	{"reasoning content", `{"messages":[{"role":"user","content":"2+2?"},{"role":"assistant","content":"4","reasoning_content":"Add the numbers."},{"role":"user","content":"3+3?"}],"add_generation_prompt":true}`},
	{"thinking off", `{"messages":[{"role":"user","content":"Quick answer: capital of France?"}],"add_generation_prompt":true,"enable_thinking":false}`},
	{"unicode and quotes", `{"messages":[{"role":"user","content":"Grüße, \"Welt\" — 你好 \\ 🎉\n\tTab"}],"tools":[{"type":"function","function":{"name":"t","description":"Größe \"q\" <b>","parameters":{"type":"object","properties":{}}}}],"add_generation_prompt":true}`},
}

// templateVars is what tokenizer_config.json supplies beside the template.
const templateVars = `"bos_token":"<s>","eos_token":"</s>"`

// Reference divergences: where @huggingface/jinja departs from Python Jinja2
// (what transformers and vLLM render with), chattmpl follows Jinja2. Each
// class has a unit case in TestConstructs/TestJinja2Semantics proving the
// Jinja2 behaviour.
const (
	divRepr     = "printing a list or dict: Jinja2 prints the Python repr, @huggingface/jinja prints JSON"
	divConcat   = "str + list: Jinja2 raises TypeError, @huggingface/jinja concatenates"
	divCoerce   = "trim of a list / map over a string: Jinja2 coerces (str(list), characters), @huggingface/jinja raises"
	divFloat    = "the 'float' test: in Jinja2 since 2.11, unknown to @huggingface/jinja"
	divIterable = "a dict 'is iterable' in Jinja2, not in @huggingface/jinja"
	divUndef    = "selectattr(attr, 'undefined') selects items without attr in Jinja2, so the template raises"
)

// knownDivergences lists every "template / case" where the reference differs
// from Jinja2; an entry that starts to agree is reported as stale.
var knownDivergences = map[string]string{
	"ardan-DeepSeek-V4-Flash.jinja / multi-part text":             divConcat,
	"ardan-DeepSeek-V4-Flash.jinja / multi-part image":            divRepr,
	"ardan-NVIDIA-Nemotron-3-Super.jinja / multi-part text":       divConcat,
	"ardan-NVIDIA-Nemotron-3-Super.jinja / multi-part image":      divRepr,
	"ardan-Qwen3-8B-Q8_0.jinja / multi-part text":                 divConcat,
	"ardan-gpt-oss-20b-Q8_0.jinja / multi-part text":              divConcat,
	"ardan-gpt-oss-20b-Q8_0.jinja / multi-part image":             divConcat,
	"qwen2.5-instruct.jinja / multi-part text":                    divConcat,
	"qwen2.5-instruct.jinja / multi-part image":                   divConcat,
	"vllm-deepseekr1.jinja / multi-part text":                     divConcat,
	"vllm-deepseekr1.jinja / multi-part image":                    divConcat,
	"vllm-deepseekv3.jinja / multi-part text":                     divConcat,
	"vllm-deepseekv3.jinja / multi-part image":                    divConcat,
	"ardan-Llama-3.2-1B-Instruct-GGUF.jinja / multi-part text":    divCoerce,
	"ardan-Llama-3.2-1B-Instruct-GGUF.jinja / multi-part image":   divCoerce,
	"ardan-gemma-4-26B-A4B-it-UD-Q8_K_XL.jinja / multi-part text": divCoerce,
	"daulet-llama3-8b-instruct.jinja / multi-part text":           divCoerce,
	"daulet-llama3-8b-instruct.jinja / multi-part image":          divCoerce,
	"vllm-phi4_mini.jinja / multi-part text":                      divCoerce,
	"vllm-phi4_mini.jinja / multi-part image":                     divRepr,
	"vllm-phi4_mini.jinja / tool call object args":                divRepr,
	"vllm-phi4_mini.jinja / parallel tool calls":                  divRepr,
	"vllm-gemma3_pythonic.jinja / tool call string args":          divCoerce,
	"vllm-gemma3_pythonic.jinja / parallel tool calls":            divIterable,
	"vllm-gemma3_pythonic.jinja / tool call object args":          divUndef,
	"ardan-Kimi-K3.jinja / tools":                                 divFloat,
	"ardan-Kimi-K3.jinja / tools no system":                       divFloat,
	"ardan-Kimi-K3.jinja / tool call object args":                 divFloat,
	"ardan-Kimi-K3.jinja / tool call string args":                 divFloat,
	"ardan-Kimi-K3.jinja / parallel tool calls":                   divFloat,
	"ardan-Kimi-K3.jinja / unicode and quotes":                    divFloat,
}

// TestTemplatesDifferential renders every case with every template in
// templateDir by @huggingface/jinja and by chattmpl: both must produce the
// same text, or both must fail. Any divergence is a failure.
func TestTemplatesDifferential(t *testing.T) {
	names := templateFiles(t)
	if len(names) < 12 {
		t.Fatalf("%d templates in %s, want at least 12", len(names), templateDir)
	}
	var jobs []hfjinja.Job
	var srcs []string
	for _, n := range names {
		src := readTemplate(t, n)
		for _, c := range diffCases {
			jobs = append(jobs, hfjinja.Job{Template: src, Vars: json.RawMessage(withTemplateVars(c.vars))})
			srcs = append(srcs, src)
		}
	}
	ref := hfjinja.Render(t, jobs)
	rendered, bothFailed, diverged := 0, 0, 0
	for i, job := range jobs {
		name, c := names[i/len(diffCases)], diffCases[i%len(diffCases)]
		got, err := renderOurs(srcs[i], job.Vars)
		same := (err != nil) == (ref[i].Err != "") && (err != nil || got == ref[i].Out)
		if why, ok := knownDivergences[name+" / "+c.name]; ok {
			if same {
				t.Errorf("%s / %s: listed as a reference divergence (%s) but both agree now; remove the entry", name, c.name, why)
			}
			diverged++
			continue
		}
		switch {
		case err != nil && ref[i].Err != "":
			bothFailed++
		case err != nil:
			t.Errorf("%s / %s: chattmpl failed (%v); @huggingface/jinja rendered %q", name, c.name, err, clip(ref[i].Out))
		case ref[i].Err != "":
			t.Errorf("%s / %s: @huggingface/jinja failed (%s); chattmpl rendered %q", name, c.name, ref[i].Err, clip(got))
		case got != ref[i].Out:
			t.Errorf("%s / %s: differs at byte %d\n ours %q\n  ref %q", name, c.name, diffAt(got, ref[i].Out), around(got, ref[i].Out), around(ref[i].Out, got))
		default:
			rendered++
		}
	}
	t.Logf("%d templates x %d cases: %d identical renders, %d rejected by both, %d known reference divergences from Jinja2",
		len(names), len(diffCases), rendered, bothFailed, diverged)
	if rendered < len(jobs)/2 {
		t.Errorf("only %d of %d jobs rendered; the cases no longer exercise the templates", rendered, len(jobs))
	}
}

func templateFiles(t *testing.T) []string {
	t.Helper()
	ents, err := os.ReadDir(templateDir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range ents {
		if strings.HasSuffix(e.Name(), ".jinja") {
			names = append(names, e.Name())
		}
	}
	slices.Sort(names)
	return names
}

func readTemplate(t *testing.T, name string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(templateDir, name))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func withTemplateVars(vars string) string {
	return "{" + templateVars + "," + strings.TrimPrefix(vars, "{")
}

// renderOurs renders with chattmpl, variables decoded in key order.
func renderOurs(src string, vars json.RawMessage) (string, error) {
	tm, err := chattmpl.Parse(src)
	if err != nil {
		return "", err
	}
	v, err := chattmpl.FromJSON(vars)
	if err != nil {
		return "", err
	}
	d := v.(*chattmpl.Dict)
	m := make(map[string]any, len(d.Keys()))
	for _, k := range d.Keys() {
		m[k], _ = d.Get(k)
	}
	return tm.Render(m)
}

func diffAt(a, b string) int {
	n := min(len(a), len(b))
	for i := 0; i < n; i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return n
}

// around shows a's text near the first difference with b.
func around(a, b string) string {
	i := diffAt(a, b)
	return a[max(0, i-60):min(len(a), i+60)]
}

func clip(s string) string {
	if len(s) > 200 {
		return s[:200] + "…"
	}
	return s
}

// TestJinja2Semantics pins the Jinja2 behaviour behind each known reference
// divergence (expected values are what Python Jinja2 3.1 renders).
func TestJinja2Semantics(t *testing.T) {
	msg := `{"messages":[{"role":"user"},{"role":"assistant","tool_calls":[1]},{"role":"user"}]}`
	for _, c := range []struct{ src, vars, want string }{
		{`{{ [{'type': 'image'}] }}|{{ {'a': 1, 'b': 'x'} }}`, `{}`, `[{'type': 'image'}]|{'a': 1, 'b': 'x'}`},
		{`{{ [' a '] | trim }}`, `{}`, `[' a ']`},
		{`{{ 'ab' | map('upper') | join('-') }}`, `{}`, `A-B`},
		{`{{ 1.5 is float }}{{ 1 is float }}`, `{}`, `TrueFalse`},
		{`{{ {'a': 1} is iterable }}{{ {'a': 1} is mapping }}`, `{}`, `TrueTrue`},
		{`{{ messages | selectattr('tool_calls', 'undefined') | list | length }}`, msg, `2`},
		{`{% for k, v in {'b': 1, 'A': 2, 'a': 3} | dictsort %}{{ k }}{{ v }},{% endfor %}`, `{}`, `A2,a3,b1,`},
		{`{% for k, v in {'b': 1, 'a': 2} | dictsort(by='value', reverse=true) %}{{ k }}{{ v }},{% endfor %}`, `{}`, `a2,b1,`},
		{`{{ messages.0.role }}{{ [[5]].0.0 }}`, msg, `user5`},
		{`{{ 'a' 'b' }}`, `{}`, `ab`},
	} {
		got, err := renderOurs(c.src, json.RawMessage(c.vars))
		if err != nil || got != c.want {
			t.Errorf("%s: got %q, %v; want %q", c.src, got, err, c.want)
		}
	}
	if _, err := renderOurs(`{{ 'a' + ['b'] }}`, json.RawMessage(`{}`)); err == nil {
		t.Error("'a' + ['b'] rendered; Jinja2 raises TypeError")
	}
}

// TestIteratesContent: vLLM's content-format detection on real templates.
func TestIteratesContent(t *testing.T) {
	for name, want := range map[string]bool{
		"vllm-llama3.1_json.jinja":        true, // for content in message['content']
		"vllm-mistral3.jinja":             true, // for block in message['content'] over loop_messages
		"vllm-gemma3_pythonic.jinja":      true,
		"daulet-llama3-8b-instruct.jinja": false,
		"qwen2.5-instruct.jinja":          false,
		"vllm-deepseekv3.jinja":           false,
	} {
		tm, err := chattmpl.Parse(readTemplate(t, name))
		if err != nil {
			t.Fatal(err)
		}
		if got := tm.IteratesContent(); got != want {
			t.Errorf("%s: IteratesContent = %v, want %v", name, got, want)
		}
	}
}
