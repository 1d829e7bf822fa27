package ingress

import (
	"net/http"
	"testing"
)

func TestOutputLengthsEstimate(t *testing.T) {
	var o outputLengths
	if got := o.estimate("m", 0); got != 0 {
		t.Fatalf("no answer, no max_tokens: %d, want 0 (the policy's default)", got)
	}
	if got := o.estimate("m", 300); got != 300 {
		t.Fatalf("no answer, max_tokens 300: %d", got)
	}
	for i := 0; i < 100; i++ {
		o.observe("m", 20+i%2*20) // 20 and 40: mean 30
	}
	o.observe("other", 1000)
	if got := o.estimate("m", 0); got != 30 {
		t.Fatalf("after answers of 20 and 40 tokens: %d, want 30", got)
	}
	if got := o.estimate("m", 10); got != 10 {
		t.Fatalf("max_tokens 10 caps the prediction: %d", got)
	}
	if got := o.estimate("m", 4096); got != 30 {
		t.Fatalf("a large max_tokens is only a cap: %d, want 30", got)
	}
	if got := o.estimate("other", 0); got != 1000 {
		t.Fatalf("per model: %d, want 1000", got)
	}
	o.observe("m", 0) // nothing to learn
	o.observe("", 5)
	if got := o.estimate("m", 0); got != 30 {
		t.Fatalf("empty observations changed the prediction: %d", got)
	}
}

// A finished answer's output tokens (usage) teach the ingress the model's
// output length, which the next request's cost is priced with.
func TestOutputLengthLearnedFromAnswers(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{})
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"max_tokens":1000}`)
	if st != 200 {
		t.Fatalf("status %d %s", st, b)
	}
	if got := s.outLens.estimate("m", 1000); got != 3 { // the fake engine's usage: 3 completion tokens
		t.Fatalf("estimate after one 3-token answer: %d, want 3", got)
	}
}

// With n choices per prompt the answer's usage counts every sequence the
// engine decoded: the learned output length is one sequence's (a request
// is then priced and charged for n of them); n is read from the body.
func TestOutputLengthPerSequence(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{})
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"max_tokens":1000,"n":3}`)
	if st != 200 {
		t.Fatalf("status %d %s", st, b)
	}
	if got := s.outLens.estimate("m", 1000); got != 1 { // the fake engine's usage: 3 completion tokens over 3 sequences
		t.Fatalf("estimate after a 3-token answer of n=3: %d, want 1", got)
	}
	var r request
	for body, want := range map[string]int{`{"prompt":"x","n":2}`: 2, `{"prompt":"x","n":null}`: 0, `{"prompt":"x","n":"2"}`: 2, `{"prompt":"x"}`: 0} {
		r.reset()
		if err := parseRequest(&r, epCompletions, []byte(body)); err != nil || r.n != want {
			t.Errorf("%s: n %d (%v), want %d", body, r.n, err, want)
		}
	}
}
