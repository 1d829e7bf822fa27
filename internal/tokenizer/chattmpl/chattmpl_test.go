package chattmpl

import (
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func render(t *testing.T, src string, vars map[string]any) (string, error) {
	t.Helper()
	tm, err := Parse(src)
	if err != nil {
		return "", err
	}
	return tm.Render(vars)
}

func msgs(t *testing.T, js string) []any {
	t.Helper()
	v, err := FromJSON([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return v.([]any)
}

// TestConstructs: one case per Jinja construct chat templates use; expected
// outputs follow Jinja2's documented semantics.
func TestConstructs(t *testing.T) {
	vars := map[string]any{
		"messages": msgs(t, `[{"role":"system","content":"S"},{"role":"user","content":"  hi  "},{"role":"assistant","content":"A","tool_calls":[{"function":{"name":"f","arguments":{"b":1,"a":"x"}}}]}]`),
		"flag":     true,
	}
	cases := []struct{ name, src, want string }{
		{"concat", `{{ 'a' + 'b' ~ 1 }}`, "ab1"},
		{"loop vars", `{% for x in [1,2,3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}`, "11,22,33"},
		{"loop index0 first revindex length", `{% for x in 'ab' %}{{ loop.index0 }}{{ loop.first }}{{ loop.revindex }}{{ loop.length }};{% endfor %}`, "0True22;1False12;"},
		{"loop previtem cycle", `{% for x in [1,2] %}{{ loop.previtem }}{{ loop.cycle('o','e') }}{% endfor %}`, "o1e"},
		{"namespace", `{% set ns = namespace(found=false) %}{% for m in messages %}{% if m.role == 'system' %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.found }}`, "True"},
		{"for scope", `{% set x = 1 %}{% for i in [1] %}{% set x = 2 %}{% endfor %}{{ x }}`, "1"},
		{"if scope leaks", `{% if true %}{% set y = 3 %}{% endif %}{{ y }}`, "3"},
		{"trim", `{{ messages[1]['content'] | trim }}|{{ messages[1].content | trim + '!' }}`, "hi|hi!"},
		{"tojson", `{{ messages[2].tool_calls[0].function.arguments | tojson }}`, `{"b": 1, "a": "x"}`},
		{"tojson indent", `{{ [1, {'k': none}] | tojson(indent=2) }}`, "[\n  1,\n  {\n    \"k\": null\n  }\n]"},
		{"tojson escapes", `{{ "q\"\n\u00e9" | tojson }}`, `"q\"\n` + "é" + `"`},
		{"tojson options", `{{ {'b': 'é', 'a': [1]} | tojson(separators=(',', ':'), sort_keys=true, ensure_ascii=true) }}`, `{"a":[1],"b":"\u00e9"}`},
		{"length join upper", `{{ messages | length }} {{ ['a','b'] | join(', ') }} {{ 'x' | upper }}`, "3 a, b X"},
		{"default", `{{ nope | default('d') }}{{ nope }}{{ '' | default('e', true) }}`, "de"},
		{"tests", `{{ nope is defined }}{{ 'a' is string }}{{ none is none }}{{ 3 is not even }}{{ messages is iterable }}{{ 1 is number }}`, "FalseTrueTrueTrueTrueTrue"},
		{"is string on content", `{% if messages[0].content is string %}s{% endif %}`, "s"},
		{"whitespace control", "a  {%- if true -%}  b  {%- endif -%}  c", "abc"},
		{"output whitespace control", "a \n{{- 'b' -}}\n c", "abc"},
		{"trim_blocks lstrip_blocks", "{% if true %}\n  x\n{% endif %}\n", "  x\n"},
		{"lstrip_blocks indent", "  {% if true %}\nx\n  {% endif %}\ny", "x\ny"},
		{"lstrip only at line start", "a  {% if true %}b{% endif %}", "a  b"},
		{"plus keeps", "  {%+ if true %}x{% endif %}", "  x"},
		{"comment", "a{# note #}b", "ab"},
		{"slices", `{{ [1,2,3,4][1:] }}{{ 'hello'[::-1] }}{{ [1,2,3][-1] }}{{ messages[-1].role }}`, "[2, 3, 4]olleh3assistant"},
		{"string methods", `{{ 'a,b'.split(',') }}{{ ' x '.strip() }}{{ 'abc'.startswith('a') }}{{ 'ab'.endswith(('x','b')) }}{{ 'x y'.title() }}`, "['a', 'b']xTrueTrueX Y"},
		{"dict items get", `{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}={{ v }};{% endfor %}{{ messages[0].get('nope', 'dflt') }}`, "a=1;b=2;dflt"},
		{"conditional expr", `{{ 'y' if 1 > 2 else 'n' }}{{ 'z' if flag }}`, "nz"},
		{"macro", `{% macro greet(name, p='Hi') %}{{ p }} {{ name }}{% endmacro %}{{ greet('Bob') }}|{{ greet('Al', p='Yo') }}`, "Hi Bob|Yo Al"},
		{"in", `{{ 'b' in 'abc' }}{{ 2 in [1,2] }}{{ 'k' in {'k': 1} }}{{ 'z' not in 'abc' }}`, "TrueTrueTrueTrue"},
		{"for else", `{% for x in [] %}a{% else %}empty{% endfor %}`, "empty"},
		{"break continue", `{% for x in [1,2,3,4] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}`, "13"},
		{"for if filter", `{% for m in messages if m.role != 'system' %}{{ m.role[0] }}{{ loop.index }}{% endfor %}`, "u1a2"},
		{"arithmetic", `{{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 1 / 2 }} {{ 2 * 3 }} {{ 2.0 + 1 }}`, "3 -4 1 0.5 6 3.0"},
		{"selectattr", `{{ messages | selectattr('role', 'equalto', 'user') | list | length }}{{ messages | map(attribute='role') | join(',') }}`, "1system,user,assistant"},
		{"elif", `{% for r in ['a','b','c'] %}{% if r == 'a' %}1{% elif r == 'b' %}2{% else %}3{% endif %}{% endfor %}`, "123"},
		{"set block", `{% set s %}x{{ 1 }}{% endset %}{{ s }}{{ s }}`, "x1x1"},
		{"repr", `{{ none }} {{ true }} {{ [none, 'a', 1.5] }} {{ {'a': 'b'} }}`, "None True [None, 'a', 1.5] {'a': 'b'}"},
		{"and or not", `{{ 1 and 'x' }}{{ 0 or 'y' }}{{ not none }}`, "xyTrue"},
		{"tuple unpack set", `{% set a, b = 1, 2 %}{{ a }}{{ b }}`, "12"},
		{"range", `{% for i in range(3) %}{{ i }}{% endfor %}{{ range(1, 7, 2) }}{{ range(1, 7, 2) | list }}`, "012range(1, 7, 2)[1, 3, 5]"},
		{"test with bare argument", `{{ flag is sameas true }}{{ 2 is divisibleby 2 }}{{ 'a' is equalto 'a' }}`, "TrueTrueTrue"},
		{"string compare", `{{ 'a' < 'b' }}{{ 2 >= 3 }}`, "TrueFalse"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := render(t, c.src, vars)
			if err != nil {
				t.Fatalf("%s: %v", c.src, err)
			}
			if got != c.want {
				t.Fatalf("%s:\n got %q\nwant %q", c.src, got, c.want)
			}
		})
	}
}

func TestErrors(t *testing.T) {
	_, err := render(t, `{{ raise_exception('bad role') }}`, nil)
	if !errors.Is(err, ErrRaised) || !strings.Contains(err.Error(), "bad role") {
		t.Fatalf("raise_exception: %v", err)
	}
	for _, src := range []string{`{% if %}`, `{% for x in y %}`, `{{ 1 + }}`, `{{ 'x }}`, `{% endfor %}`, `{% bogus %}`, `{{ a[ }}`} {
		if _, err := Parse(src); !errors.Is(err, ErrSyntax) {
			t.Errorf("%q: got %v, want a syntax error", src, err)
		}
	}
	for _, src := range []string{`{{ x | nosuchfilter }}`, `{{ 1 / 0 }}`, `{{ 'a' - 1 }}`, `{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}`, `{% for i in range(100000000) %}{% endfor %}`} {
		if _, err := render(t, src, nil); !errors.Is(err, ErrRender) {
			t.Errorf("%q: got %v, want a render error", src, err)
		}
	}
}

// TestKimiTemplate renders the Kimi K2 template shipped beside Llama 3's: it
// uses whitespace control everywhere, loop.first, .get, is string, tojson.
func TestKimiTemplate(t *testing.T) {
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/daulet/tokenizers").Output()
	if err != nil {
		t.Fatalf("go mod download: %v", err)
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(out, &mod); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(mod.Dir, "test", "data", "kimi-k2-instruct", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ChatTemplate string `json:"chat_template"`
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		t.Fatal(err)
	}
	tm, err := Parse(cfg.ChatTemplate)
	if err != nil {
		t.Fatal(err)
	}
	got, err := tm.Render(map[string]any{
		"messages":              msgs(t, `[{"role":"user","content":"hi"},{"role":"assistant","content":"","tool_calls":[{"id":"c1","function":{"name":"get","arguments":"{\"q\": 1}"}}]},{"role":"tool","tool_call_id":"c1","content":"42"}]`),
		"add_generation_prompt": true,
	})
	if err != nil {
		t.Fatal(err)
	}
	want := "<|im_system|>system<|im_middle|>You are a helpful assistant<|im_end|>" +
		"<|im_user|>user<|im_middle|>hi<|im_end|>" +
		"<|im_assistant|>assistant<|im_middle|><|tool_calls_section_begin|><|tool_call_begin|>functions.get:0<|tool_call_argument_begin|>\"{\\\"q\\\": 1}\"<|tool_call_end|><|tool_calls_section_end|><|im_end|>" +
		"<|im_system|>tool<|im_middle|>## Return of c1\\n42<|im_end|>" +
		"<|im_assistant|>assistant<|im_middle|>"
	if got != want {
		t.Fatalf("got\n%q\nwant\n%q", got, want)
	}
}

func FuzzParse(f *testing.F) {
	for _, s := range []string{
		`{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}`,
		`{%- for m in messages -%}{{ m.content | tojson(indent=2) }}{%- endfor -%}`,
		`{% macro f(a, b=1) %}{{ a ~ b }}{% endmacro %}{{ f(1) if x else [1,2][::-1] }}`,
		`{% set ns = namespace(a=1) %}{% set ns.a = ns.a + 1 %}{{ ns.a is number }}`,
		"a {#- c -#} b {{- x -}} {%+ if y %}z{% endif %}",
	} {
		f.Add(s)
	}
	vars := map[string]any{"messages": []any{}, "x": int64(1), "bos_token": "<s>"}
	f.Fuzz(func(t *testing.T, src string) {
		tm, err := Parse(src)
		if err != nil {
			if !errors.Is(err, ErrSyntax) {
				t.Fatalf("parse error not wrapping ErrSyntax: %v", err)
			}
			return
		}
		_, _ = tm.Render(vars) // must not panic or hang
	})
}
