package ingress

import (
	"encoding/json"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress/ratelimit"
)

// pyInt reads an int member as vLLM's pydantic (v2, lax mode) validates one
// from what Python's json decoded. The expectations are pydantic 2.13.4's
// (pydantic-core 2.46.4) answers to {"n": <value>} for an int field,
// saturated to int64 where Python's int is larger.
func TestPyInt(t *testing.T) {
	for _, tc := range []struct {
		val  string
		want int64
		ok   bool
	}{
		{`"64"`, 64, true},
		{`" 64 "`, 64, true},
		{`"\t64\n"`, 64, true},
		{`"\u00a064"`, 64, true},
		{`"64\u2003"`, 64, true},
		{`"+64"`, 64, true},
		{`"064"`, 64, true},
		{`"-0"`, 0, true},
		{`"00"`, 0, true},
		{`"64.0"`, 64, true},
		{`"64.00"`, 64, true},
		{`"0.0"`, 0, true},
		{`"1_000"`, 1000, true},
		{`"1_0.0"`, 10, true},
		{`"0_1"`, 1, true},
		{`"0-1"`, -1, true},
		{`"64."`, 0, false},
		{`".0"`, 0, false},
		{`"64.5"`, 0, false},
		{`"1e2"`, 0, false},
		{`"0x40"`, 0, false},
		{`""`, 0, false},
		{`"   "`, 0, false},
		{`"_1"`, 0, false},
		{`"1_"`, 0, false},
		{`"1__0"`, 0, false},
		{`"+-1"`, 0, false},
		{`"--1"`, 0, false},
		{`"- 1"`, 0, false},
		{`"6 4"`, 0, false},
		{`"\u0036\u0034"`, 64, true},
		{`"\u0664"`, 0, false},
		{`"99999999999999999999999"`, 9223372036854775807, true},
		{`"-99999999999999999999999"`, -9223372036854775808, true},
		{`true`, 1, true},
		{`false`, 0, true},
		{`64`, 64, true},
		{`-5`, -5, true},
		{`0`, 0, true},
		{`64.0`, 64, true},
		{`1e2`, 100, true},
		{`1E3`, 1000, true},
		{`-0.0`, 0, true},
		{`64.5`, 0, false},
		{`1e400`, 0, false},
		{`9.2e18`, 9200000000000000000, true},
		{`9.3e18`, 0, false},
		{`99999999999999999999999`, 9223372036854775807, true},
		{`"nan"`, 0, false},
		{`"inf"`, 0, false},
		{`[]`, 0, false},
		{`{}`, 0, false},
		{`"1.5e1"`, 0, false},
	} {
		v, ok := pyInt([]byte(tc.val))
		if ok != tc.ok || ok && v != tc.want {
			t.Errorf("pyInt(%s) = %d, %v; pydantic: %d, %v", tc.val, v, ok, tc.want, tc.ok)
		}
	}
	if v, ok := pyInt([]byte(`"` + strings.Repeat(" ", 4300) + `1"`)); ok {
		t.Errorf("a string longer than CPython's int() reads read as %d", v)
	}
}

// pyBool reads what pydantic's lax bool reads, and nothing else.
func TestPyBool(t *testing.T) {
	for _, tc := range []struct {
		val  string
		want bool
		ok   bool
	}{
		{`true`, true, true}, {`false`, false, true}, {`1`, true, true}, {`0`, false, true},
		{`1.0`, true, true}, {`0.0`, false, true}, {`-0`, false, true}, {`1e0`, true, true},
		{`"yes"`, true, true}, {`"Y"`, true, true}, {`"On"`, true, true}, {`"t"`, true, true}, {`"TRUE"`, true, true}, {`"1"`, true, true},
		{`"no"`, false, true}, {`"N"`, false, true}, {`"OFF"`, false, true}, {`"f"`, false, true}, {`"False"`, false, true}, {`"0"`, false, true},
		{`"\u0074rue"`, true, true}, {`"\u0079es"`, true, true},
		{`2`, false, false}, {`0.5`, false, false}, {`-1`, false, false}, {`"2"`, false, false}, {`"yess"`, false, false},
		{`" yes"`, false, false}, {`""`, false, false}, {`"truee"`, false, false}, {`"1.0"`, false, false},
		{`null`, false, false}, {`[]`, false, false}, {`{}`, false, false}, {`tru`, false, false},
	} {
		v, ok := pyBool([]byte(tc.val))
		if ok != tc.ok || ok && v != tc.want {
			t.Errorf("pyBool(%s) = %v, %v; pydantic: %v, %v", tc.val, v, ok, tc.want, tc.ok)
		}
	}
}

// Every member the ingress prices or routes on is read as vLLM reads the body:
// Python's json keeps the last member of a name, null included, and pydantic
// coerces a numeric string ("n": "64"); a member vLLM's endpoint does not have
// (max_completion_tokens outside chat, n and truncate_prompt_tokens in the
// Responses and Messages APIs) counts for nothing.
func TestMembersReadAsVLLM(t *testing.T) {
	const chat = `"model":"m","messages":[{"role":"user","content":"hi"}]`
	const cmpl = `"model":"m","prompt":"hi"`
	const resp = `"model":"m","input":"hi"`
	const msgs = `"model":"m","messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct {
		name      string
		ep        endpoint
		body      string
		maxTokens int
		n         int
		truncate  int
		badParam  string // a 400 naming this member; "" for none
	}{
		{"max_tokens null after a number", epChat, `{` + chat + `,"max_tokens":1,"max_tokens":null}`, -1, 0, 0, ""},
		{"max_completion_tokens null after a number", epChat, `{` + chat + `,"max_completion_tokens":1,"max_completion_tokens":null}`, -1, 0, 0, ""},
		{"max_completion_tokens null: max_tokens applies", epChat, `{` + chat + `,"max_completion_tokens":1,"max_tokens":7,"max_completion_tokens":null}`, 7, 0, 0, ""},
		{"max_completion_tokens last number wins", epChat, `{` + chat + `,"max_completion_tokens":null,"max_tokens":7,"max_completion_tokens":5}`, 5, 0, 0, ""},
		{"max_completion_tokens wins, negative max_tokens unused", epChat, `{` + chat + `,"max_completion_tokens":3,"max_tokens":-1}`, 3, 0, 0, ""},
		{"negative max_tokens", epChat, `{` + chat + `,"max_tokens":-1}`, 0, 0, 0, "max_tokens"},
		{"a bad member overridden", epChat, `{` + chat + `,"max_tokens":"abc","max_tokens":5}`, 5, 0, 0, ""},
		{"a bad last member", epChat, `{` + chat + `,"max_tokens":5,"max_tokens":"abc"}`, 0, 0, 0, "max_tokens"},
		{"a bad max_tokens beside max_completion_tokens", epChat, `{` + chat + `,"max_completion_tokens":5,"max_tokens":{}}`, 0, 0, 0, "max_tokens"},
		{"max_tokens a numeric string", epChat, `{` + chat + `,"max_tokens":"64"}`, 64, 0, 0, ""},
		{"max_completion_tokens with underscores", epChat, `{` + chat + `,"max_completion_tokens":" 1_000 "}`, 1000, 0, 0, ""},
		{"max_tokens true", epCompletions, `{` + cmpl + `,"max_tokens":true}`, 1, 0, 0, ""},
		{"max_tokens a fraction", epCompletions, `{` + cmpl + `,"max_tokens":"6.5"}`, 0, 0, 0, "max_tokens"},
		{"max_tokens beyond int32", epCompletions, `{` + cmpl + `,"max_tokens":1e12}`, math.MaxInt32, 0, 0, ""},
		{"completions: null after a number", epCompletions, `{` + cmpl + `,"max_tokens":16,"max_tokens":null}`, -1, 0, 0, ""},
		{"completions: no max_completion_tokens", epCompletions, `{` + cmpl + `,"max_tokens":10,"max_completion_tokens":1}`, 10, 0, 0, ""},
		{"messages: no max_completion_tokens", epMessages, `{` + msgs + `,"max_tokens":10,"max_completion_tokens":1}`, 10, 0, 0, ""},
		{"messages: max_tokens null last", epMessages, `{` + msgs + `,"max_tokens":10,"max_tokens":null}`, 0, 0, 0, "max_tokens"},
		{"responses: max_output_tokens null last", epResponses, `{` + resp + `,"max_output_tokens":16,"max_output_tokens":null}`, -1, 0, 0, ""},
		{"responses: max_output_tokens a string", epResponses, `{` + resp + `,"max_output_tokens":"16"}`, 16, 0, 0, ""},
		{"responses: no max_tokens", epResponses, `{` + resp + `,"max_tokens":5,"max_completion_tokens":5}`, -1, 0, 0, ""},
		{"n a numeric string", epChat, `{` + chat + `,"max_tokens":1,"n":"64"}`, 1, 64, 0, ""},
		{"n padded", epCompletions, `{` + cmpl + `,"n":" 8 "}`, 16, 8, 0, ""},
		{"n a whole float", epCompletions, `{` + cmpl + `,"n":2.0}`, 16, 2, 0, ""},
		{"n null after a number", epChat, `{` + chat + `,"n":64,"n":null}`, -1, 0, 0, ""},
		{"n not a number, for the engine to refuse", epChat, `{` + chat + `,"n":8,"n":"abc"}`, -1, 0, 0, ""},
		{"n beyond int32", epCompletions, `{` + cmpl + `,"n":"99999999999"}`, 16, math.MaxInt32, 0, ""},
		{"responses: no n", epResponses, `{` + resp + `,"n":4}`, -1, 0, 0, ""},
		{"messages: no n", epMessages, `{` + msgs + `,"max_tokens":1,"n":4}`, 1, 0, 0, ""},
		{"truncate null after a number", epChat, `{` + chat + `,"truncate_prompt_tokens":5,"truncate_prompt_tokens":null}`, -1, 0, 0, ""},
		{"truncate a string", epCompletions, `{` + cmpl + `,"truncate_prompt_tokens":"5"}`, 16, 0, 5, ""},
		{"truncate -1: the model's", epCompletions, `{` + cmpl + `,"truncate_prompt_tokens":3,"truncate_prompt_tokens":-1}`, 16, 0, 0, ""},
		{"truncate 0", epCompletions, `{` + cmpl + `,"truncate_prompt_tokens":0}`, -1, 0, 0, "truncate_prompt_tokens"},
		{"truncate a bad member overridden", epCompletions, `{` + cmpl + `,"truncate_prompt_tokens":"x","truncate_prompt_tokens":3}`, 16, 0, 3, ""},
		{"responses: no truncate_prompt_tokens", epResponses, `{` + resp + `,"truncate_prompt_tokens":1}`, -1, 0, 0, ""},
		{"messages: no truncate_prompt_tokens", epMessages, `{` + msgs + `,"max_tokens":1,"truncate_prompt_tokens":1}`, 1, 0, 0, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var r request
			err := parseRequest(&r, tc.ep, []byte(tc.body))
			if tc.badParam != "" {
				if err == nil {
					t.Fatalf("%s: accepted (max tokens %d), want a 400 naming %s", tc.body, r.maxTokens, tc.badParam)
				}
				if ae := toAPIError(err); ae.status != 400 || ae.param != tc.badParam {
					t.Fatalf("%s: err %v, want a 400 naming %s", tc.body, err, tc.badParam)
				}
				return
			}
			if err != nil {
				t.Fatalf("%s: %v", tc.body, err)
			}
			if r.maxTokens != tc.maxTokens || r.n != tc.n || r.truncate != tc.truncate {
				t.Fatalf("%s: max tokens %d, n %d, truncate %d; want %d, %d, %d", tc.body, r.maxTokens, r.n, r.truncate, tc.maxTokens, tc.n, tc.truncate)
			}
		})
	}
}

// The other members read for routing follow the last member too, null
// included: stream_options (whether the ingress asks for the usage chunk), the
// cache salt (the block keys), a batch replaced by a single prompt (the
// sequences priced), the Responses API's instructions (the prompt keyed and
// counted) and previous_response_id (the engine it goes to).
func TestRoutingMembersLastWins(t *testing.T) {
	var r request
	body := `{"model":"m","prompt":["a","b"],"stream":true,"stream_options":{"include_usage":true},"cache_salt":"s","stream_options":null,"cache_salt":null,"prompt":"c"}`
	if err := parseRequest(&r, epCompletions, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if r.hasStreamOptions || r.includeUsage || len(r.cacheSalt) != 0 || len(r.batch) != 0 || r.kind != promptText || string(r.text) != "c" {
		t.Fatalf("stream options %v (usage %v), salt %q, batch %d, kind %v %q", r.hasStreamOptions, r.includeUsage, r.cacheSalt, len(r.batch), r.kind, r.text)
	}
	r = request{}
	if err := parseRequest(&r, epCompletions, []byte(`{"model":"m","prompt":["a","b"],"prompt":[1,2]}`)); err != nil {
		t.Fatal(err)
	}
	if len(r.batch) != 0 || r.kind != promptIDs || len(r.ids) != 2 {
		t.Fatalf("batch %d, kind %v, ids %v", len(r.batch), r.kind, r.ids)
	}
	r = request{}
	body = `{"model":"m","input":"hi","instructions":"be brief","previous_response_id":"resp_x","instructions":null,"previous_response_id":null}`
	if err := parseRequest(&r, epResponses, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if len(r.instructions) != 0 || len(r.prevResponse) != 0 || strings.Contains(string(r.messages), "be brief") {
		t.Fatalf("instructions %q, previous response %q, messages %s", r.instructions, r.prevResponse, r.messages)
	}
}

// Chat sent as completions carries the output limit chat reads, whatever
// duplicates, nulls and escaped keys the body holds: the completions body's
// last max_tokens (what the engine reads) is the chat's limit, or null or
// absent when it has none.
func TestChatAsCompletionsKeepsTheLimit(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, body := range []string{
		`{"model":"m",` + msgs + `,"max_completion_tokens":5,"max_tokens":null}`,
		`{"model":"m","max_tokens":null,` + msgs + `,"max_completion_tokens":5}`,
		`{"model":"m",` + msgs + `,"max_completion_tokens":10,"max_tokens":5,"max_tokens":7}`,
		`{"max_tokens":5,"max_completion_tokens":10,"max_tokens":7,"model":"m",` + msgs + `}`,
		`{"model":"m",` + msgs + `,"max_completion_tokens":10,"max_completion_tokens":null,"max_tokens":3}`,
		`{"model":"m",` + msgs + `,"max_completion_tokens":null,"max_completion_tokens":"12" }`,
		`{"model":"m",` + msgs + `,"max_tokens":4,"max_tokens":null}`,
		`{"model":"m",` + msgs + `,"max_completion_tokens":4,"max_completion_tokens":null}`,
		`{"model":"m",` + msgs + `,"max_completion_tok\u0065ns":5}`,
	} {
		var r request
		if err := parseRequest(&r, epChat, []byte(body)); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		out := chatToCompletionsBody(nil, []byte(body), &r, []uint32{4, 2}, 0)
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Errorf("%s → %s: %v", body, out, err)
			continue
		}
		raw, has := got["max_tokens"]
		switch v, ok := pyInt(raw); {
		case r.maxTokens < 0 && (!has || string(raw) != "null"):
			t.Errorf("%s: chat has no limit, completions body %s", body, out)
		case r.maxTokens >= 0 && (!ok || v != int64(r.maxTokens)):
			t.Errorf("%s: chat limit %d, completions body %s", body, r.maxTokens, out)
		}
		if _, has := got["messages"]; has {
			t.Errorf("%s: messages left in %s", body, out)
		}
	}
}

// Through the ingress: a numeric-string n multiplies the output reserved, so
// max_tokens 100 × n "64" is too large for an output budget of 1000 (it was
// priced as one sequence); a later max_tokens null leaves no maximum, so the
// 2000 before it no longer makes the request too large; and
// max_completion_tokens, which /v1/completions does not read, does not shrink
// the max_tokens it does.
func TestLimitsReadAsVLLMThroughIngress(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	now := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	lim, err := ratelimit.New(ratelimit.Config{PerKey: ratelimit.Limits{OutputTokens: 1000}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{Limiter: lim})
	url := "http://" + s.Addr() + "/v1/completions"
	for _, tc := range []struct {
		body      string
		status    int
		requested string // in the too-large message
	}{
		{`{"model":"m","prompt":[1,2,3],"max_tokens":100,"n":"64"}`, 429, "Requested 6400"},
		{`{"model":"m","prompt":[1,2,3],"max_tokens":2000,"max_tokens":null}`, 200, ""},
		{`{"model":"m","prompt":[1,2,3],"max_tokens":2000,"max_completion_tokens":5}`, 429, "Requested 2000"},
	} {
		st, hdr, b := post(t, http.DefaultClient, url, tc.body)
		if st != tc.status || tc.requested != "" && (!strings.Contains(string(b), tc.requested) || hdr.Get("Retry-After") != "") {
			t.Errorf("%s: %d %s; want %d %s", tc.body, st, b, tc.status, tc.requested)
		}
	}
}
