package ingress

import (
	"strings"
	"testing"
)

// An engine URL must be http(s) with a port a dial can use: :65536 and :0
// passed (url.Parse takes any digits) and failed at every request.
func TestValidateEngineURL(t *testing.T) {
	for url, want := range map[string]string{
		"http://127.0.0.1:65536":       "port 65536: want 1..65535",
		"http://127.0.0.1:99999999999": "port 99999999999",
		"http://127.0.0.1:0":           "port 0",
		"ftp://127.0.0.1:8000":         "must be http(s)://host:port",
		"127.0.0.1:8000":               "must be http(s)://host:port",
		"http://127.0.0.1:8000":        "",
		"https://[::1]:65535":          "",
		"http://engine":                "", // the scheme's port
	} {
		c := DefaultConfig()
		c.Engines = []StaticEngine{{ID: "e", Model: "m", URL: url}}
		err := c.Validate()
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v", url, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", url, err, want)
		}
	}
}

// A chat template is read with its model's tokenizer only: one for a model
// without a tokenizer was ignored, its path never opened.
func TestValidateChatTemplateNeedsTokenizer(t *testing.T) {
	c := DefaultConfig()
	c.ChatTemplates = map[string]string{"m": "/nonexist"}
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), `chat template for "m" is not read without a tokenizer`) {
		t.Fatalf("template without tokenizer: %v", err)
	}
	c.Tokenizers = map[string]string{"m": "/tok"}
	if err := c.Validate(); err != nil {
		t.Fatalf("template with its tokenizer: %v", err)
	}
}

// A config file is one YAML document: a second one was silently ignored.
func TestParseConfigOneDocument(t *testing.T) {
	for doc, ok := range map[string]bool{
		"listen: :1\n":                  true,
		"":                              true,
		"---\nlisten: :1\n":             true,
		"listen: :1\n---\n":             true,
		"listen: :1\n---\nbogus: 1\n":   false,
		"listen: :1\n---\nlisten: :2\n": false,
		"listen: :1\n...\n---\nx: 1\n":  false,
	} {
		_, err := ParseConfig([]byte(doc))
		if ok && err != nil || !ok && (err == nil || !strings.Contains(err.Error(), "more than one YAML document")) {
			t.Errorf("%q: %v", doc, err)
		}
	}
}

// --engine's mistakes are named as what they are: a missing URL (it said
// "empty id"), and in the key=value form a key it does not know.
func TestParseStaticEngineErrors(t *testing.T) {
	for s, want := range map[string]string{
		"m=":   "no url",
		"a=m=": "no url",
		"id=a,model=m,url=http://127.0.0.1:1,events=tcp://h:1": `unknown key "events" (keys: id, model, url, role, group, pd, bootstrap)`,
		"model=m,url=http://127.0.0.1:1,role":                  `"role" is not key=value`,
		"model=m,url=http://127.0.0.1:1,model=n":               "model= given twice",
		"id=a,url=http://127.0.0.1:1":                          "model= and url= are required",
	} {
		if _, err := ParseStaticEngine(s); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", s, err, want)
		}
	}
	if e, err := ParseStaticEngine("a=m=http://127.0.0.1:1/x?y=1,2"); err != nil || e.ID != "a" {
		t.Errorf("%+v %v", e, err)
	}
}

// A duration written without its unit (sendTimeout: 0) is refused with how
// to write one; yaml's own message named only a Go type.
func TestParseConfigDurationNeedsUnit(t *testing.T) {
	_, err := ParseConfig([]byte("sendTimeout: 0\n"))
	if err == nil || !strings.Contains(err.Error(), "a duration takes its unit: 30s, 500ms, 0s for off") {
		t.Fatalf("sendTimeout: 0: %v, want the way to write a duration", err)
	}
	if cfg, err := ParseConfig([]byte("sendTimeout: 0s\n")); err != nil || cfg.SendTimeout != 0 {
		t.Fatalf("sendTimeout: 0s: %v, %v", cfg.SendTimeout, err)
	}
}

// TestParseStaticEngineRoles: --engine's key=value form (the sidecar's
// --engine keys) gives a static engine its P/D fields, which the
// positional form has no room for: with it, --engine alone can run P/D.
func TestParseStaticEngineRoles(t *testing.T) {
	e, err := ParseStaticEngine("id=p1,model=m,url=http://127.0.0.1:1,role=prefill,group=g,pd=sglang,bootstrap=127.0.0.1:8998")
	want := StaticEngine{ID: "p1", Model: "m", URL: "http://127.0.0.1:1", Role: "prefill", Group: "g", PDProtocol: "sglang", Bootstrap: "127.0.0.1:8998"}
	if err != nil || e != want {
		t.Errorf("%+v, %v; want %+v", e, err, want)
	}
	if e, err := ParseStaticEngine("model=m,url=http://127.0.0.1:2,role=decode"); err != nil || e.ID != "127.0.0.1:2" || e.Role != "decode" {
		t.Errorf("id from the url: %+v, %v", e, err)
	}
	cfg := DefaultConfig()
	cfg.Engines = []StaticEngine{{ID: "a", Model: "m", URL: "http://127.0.0.1:1", Role: "prefilll"}}
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `role "prefilll"`) {
		t.Errorf("a bad role: %v", err)
	}
}
