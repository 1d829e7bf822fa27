package workload

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

// TestShareGPT: every answered user turn is a request whose prompt is the
// conversation so far (so a session's turns share their prefix, and
// sessions share nothing), lengths are the text's bytes / Bytes, and the
// dataset's variants (from/value, role/content, system turns, unanswered
// and unprompted turns) are read as a chat client would send them.
func TestShareGPT(t *testing.T) {
	reqs, err := ShareGPT{Seed: 3}.ReadFile("testdata/sharegpt_sample.json")
	if err != nil {
		t.Fatal(err)
	}
	bySession := map[string][]Request{}
	for _, r := range reqs {
		bySession[r.Session] = append(bySession[r.Session], r)
	}
	// a1: two answered turns; b2: one (after a system turn); c3: one (the
	// last user turn has no answer); d4: one (the leading answer prompts
	// nothing); e5: none.
	if len(reqs) != 5 || len(bySession["sg0"]) != 2 || len(bySession["sg1"]) != 1 || len(bySession["sg2"]) != 1 || len(bySession["sg3"]) != 1 {
		t.Fatalf("%d requests by session %v", len(reqs), bySession)
	}
	est := func(s string) int { return max(1, int(float64(len(s))/4+0.5)) }
	a := bySession["sg0"]
	q1, a1 := "What is the capital of France, and why did it become the capital?", "Paris. It became the capital because the Capetian kings made it their seat and it grew into the centre of trade and learning."
	if a[0].PromptTokens != est(q1) || a[0].OutputTokens != est(a1) || a[1].PromptTokens != est(q1)+est(a1)+est("And of Italy?") ||
		a[1].OutputTokens != est("Rome, since 1871.") || a[1].Arrival < a[0].Arrival {
		t.Fatalf("a1: %+v", a)
	}
	p0, p1 := a[0].AppendPrompt(nil), a[1].AppendPrompt(nil)
	if len(p0) != a[0].PromptTokens || len(p1) != a[1].PromptTokens || !slices.Equal(p1[:len(p0)], p0) {
		t.Fatal("a session's second turn does not extend its first")
	}
	d := bySession["sg3"][0]
	if d.PromptTokens != est("A greeting nobody asked for.")+est("Hi")+est("Are you there?") {
		t.Fatalf("d4: prompt %d", d.PromptTokens)
	}
	if b := bySession["sg1"][0].AppendPrompt(nil); b[0] == p0[0] {
		t.Fatal("two conversations share their first token")
	}
	// Limits: the first two conversations, a context that fits a1's first turn only.
	if reqs, err := (ShareGPT{Conversations: 2}).ReadFile("testdata/sharegpt_sample.json"); err != nil || len(reqs) != 3 {
		t.Fatalf("two conversations: %d requests, %v", len(reqs), err)
	}
	if reqs, err := (ShareGPT{MaxContext: est(q1) + est(a1) + 2, Conversations: 1}).ReadFile("testdata/sharegpt_sample.json"); err != nil || len(reqs) != 1 {
		t.Fatalf("max context: %d requests, %v", len(reqs), err)
	}
	for _, bad := range []string{`{"conversations":[]}`, `[{"conversations":7}]`, `[]`, `[{"conversations":[{"from":"human","value":"x"}]}]`} {
		if _, err := (ShareGPT{}).Read(strings.NewReader(bad)); !errors.Is(err, ErrBadWorkload) {
			t.Errorf("%s: %v", bad, err)
		}
	}
	if _, err := (ShareGPT{Rate: -1}).Read(strings.NewReader(`[]`)); !errors.Is(err, ErrBadWorkload) {
		t.Errorf("negative rate: %v", err)
	}
}

// FuzzShareGPT: any input gives requests or a workload error, never a
// panic, and every request's prompt has its length.
func FuzzShareGPT(f *testing.F) {
	f.Add(`[{"conversations":[{"from":"human","value":"hi"},{"from":"gpt","value":"hello"}]}]`)
	f.Add(`[{"messages":[{"role":"system","content":"s"},{"role":"user","content":"q"},{"role":"assistant","content":"a"}]},{}]`)
	f.Add(`[{"conversation":[{"from":"gpt","value":""}]}`)
	f.Fuzz(func(t *testing.T, in string) {
		reqs, err := ShareGPT{Seed: 1, MaxContext: 4096}.Read(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrBadWorkload) {
				t.Fatalf("unclassified error %v", err)
			}
			return
		}
		for _, r := range reqs {
			if r.PromptTokens < 1 || r.OutputTokens < 1 || len(r.AppendPrompt(nil)) != r.PromptTokens {
				t.Fatalf("request %+v", r)
			}
		}
	})
}

// TestShareGPTNotAnArray: a file that is valid JSON but not an array (a
// JSONL trace) says what it starts with (it said "(<nil>)").
func TestShareGPTNotAnArray(t *testing.T) {
	_, err := (ShareGPT{}).Read(strings.NewReader("{\"timestamp\": 0}\n{\"timestamp\": 1}\n"))
	if !errors.Is(err, ErrBadWorkload) || strings.Contains(err.Error(), "nil") || !strings.Contains(err.Error(), `the file starts with "{"`) {
		t.Errorf("err %v", err)
	}
}
