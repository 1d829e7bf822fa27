package workload

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
)

// wellFormed checks what every consumer relies on: arrivals in order, ids
// 0..n-1, the prompt exactly PromptTokens long in the vocabulary, at least
// one output token.
func wellFormed(t *testing.T, name string, reqs []Request) {
	t.Helper()
	if len(reqs) == 0 {
		t.Fatalf("%s: no requests", name)
	}
	for i := range reqs {
		r := &reqs[i]
		if r.ID != i || (i > 0 && r.Arrival < reqs[i-1].Arrival) || r.Arrival < 0 {
			t.Fatalf("%s: request %d: id %d arrival %v after %v", name, i, r.ID, r.Arrival, reqs[max(i-1, 0)].Arrival)
		}
		p := r.Prompt()
		if len(p) != r.PromptTokens || r.PromptTokens <= 0 || r.OutputTokens < 1 {
			t.Fatalf("%s: request %d: prompt %d tokens, PromptTokens %d, output %d", name, i, len(p), r.PromptTokens, r.OutputTokens)
		}
		for _, tok := range p {
			if tok < TokenBase || tok >= TokenBase+TokenRange {
				t.Fatalf("%s: token %d out of range", name, tok)
			}
		}
	}
}

func sameRequests(t *testing.T, name string, a, b []Request) {
	t.Helper()
	if len(a) != len(b) {
		t.Fatalf("%s: %d vs %d requests", name, len(a), len(b))
	}
	for i := range a {
		if a[i].Arrival != b[i].Arrival || a[i].OutputTokens != b[i].OutputTokens || a[i].Session != b[i].Session ||
			!slices.Equal(a[i].Prompt(), b[i].Prompt()) {
			t.Fatalf("%s: request %d differs between runs of the same seed", name, i)
		}
	}
}

// TestChat: deterministic by seed, well-formed, and conversations grow:
// each turn's prompt is the previous turn's prompt + its answer + a new
// user message.
func TestChat(t *testing.T) {
	c := Chat{Sessions: 40, Seed: 1}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "chat", reqs)
	again, _ := c.Generate()
	sameRequests(t, "chat", reqs, again)
	other, _ := Chat{Sessions: 40, Seed: 2}.Generate()
	if len(other) == len(reqs) && slices.Equal(other[0].Prompt(), reqs[0].Prompt()) && other[0].Arrival == reqs[0].Arrival {
		t.Fatal("seed 2 gives seed 1's workload")
	}
	last := map[string]*Request{}
	multi, interleaved := 0, false
	for i := range reqs {
		r := &reqs[i]
		if prev, ok := last[r.Session]; ok {
			multi++
			p, q := prev.Prompt(), r.Prompt()
			grow := r.PromptTokens - prev.PromptTokens - prev.OutputTokens
			if !slices.Equal(q[:len(p)], p) || grow < 1 {
				t.Fatalf("session %s: turn is not previous prompt + answer + user message (grew by %d beyond the answer)", r.Session, grow)
			}
			if r.Group != prev.Group {
				t.Fatalf("session %s changed system prompt", r.Session)
			}
			if i > 0 && reqs[i-1].Session != r.Session {
				interleaved = true
			}
		}
		last[r.Session] = r
	}
	if multi == 0 || !interleaved || len(last) != 40 {
		t.Fatalf("%d follow-up turns over %d sessions, interleaved %v", multi, len(last), interleaved)
	}
	// Sessions sharing a system prompt share its 800 tokens; the oracle
	// sees the hits of growing conversations on top.
	if h := OracleHitRate(reqs, 16); h < 0.3 {
		t.Fatalf("oracle hit rate %.3f: conversations should reuse their history", h)
	}
	lim, _ := Chat{Sessions: 40, Seed: 1, Limit: 10, RateScale: 2}.Generate()
	if len(lim) != 10 || lim[9].Arrival != reqs[9].Arrival/2 {
		t.Fatalf("limit/rate scale: %d requests, arrival %v vs %v", len(lim), lim[9].Arrival, reqs[9].Arrival)
	}
}

// TestToolAgent: deterministic, well-formed; a family's calls share its
// long system prompt; tasks grow call by call; some tool results are long.
func TestToolAgent(t *testing.T) {
	c := ToolAgent{Tasks: 60, Seed: 1}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "tool-agent", reqs)
	again, _ := c.Generate()
	sameRequests(t, "tool-agent", reqs, again)
	byFam := map[int][]uint32{}
	last := map[string]*Request{}
	long := 0
	for i := range reqs {
		r := &reqs[i]
		p := r.Prompt()
		if r.PromptTokens < 3000 || r.OutputTokens > 91 {
			t.Fatalf("call %d: prompt %d (system ≥ 3000), output %d (calls are short)", i, r.PromptTokens, r.OutputTokens)
		}
		if f, ok := byFam[r.Group]; ok && !slices.Equal(f[:3000], p[:3000]) {
			t.Fatalf("family %d: system prompts differ", r.Group)
		}
		byFam[r.Group] = p
		if prev, ok := last[r.Session]; ok {
			if !slices.Equal(p[:prev.PromptTokens], prev.Prompt()) {
				t.Fatal("a call does not extend the task's previous call")
			}
			if r.PromptTokens-prev.PromptTokens-prev.OutputTokens >= 3000 {
				long++
			}
		}
		last[r.Session] = r
	}
	if len(byFam) < 3 || long == 0 {
		t.Fatalf("%d families used, %d long tool results", len(byFam), long)
	}
}

const azureCSV = `TIMESTAMP,ContextTokens,GeneratedTokens
2023-11-16 18:15:46.6805900,374,44
2023-11-16 18:15:50.9951690,396,109
2023-11-16 18:15:51.2224670,879,55
2023-11-16 18:15:51.3910170,91,16
`

func TestAzure(t *testing.T) {
	reqs, err := Azure{Seed: 1, Share: 1, Groups: 2, PrefixMin: 100, PrefixMax: 100}.Read(strings.NewReader(azureCSV))
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "azure", reqs)
	if len(reqs) != 4 || reqs[1].Arrival != 4314579*time.Microsecond || reqs[2].PromptTokens != 879 || reqs[2].OutputTokens != 55 {
		t.Fatalf("%+v", reqs)
	}
	// Prefixes: every request carries one of two 100-token prefixes (the
	// 91-token one is all prefix, cut).
	heads := map[int][]uint32{}
	for i := range reqs {
		p := reqs[i].Prompt()
		n := min(100, len(p))
		if h, ok := heads[reqs[i].Group]; ok && !slices.Equal(h[:n], p[:n]) {
			t.Fatal("same group, different prefix")
		}
		if len(p) >= 100 {
			heads[reqs[i].Group] = p
		}
	}
	again, _ := Azure{Seed: 1, Share: 1, Groups: 2, PrefixMin: 100, PrefixMax: 100}.Read(strings.NewReader(azureCSV))
	sameRequests(t, "azure", reqs, again)
	half, _ := Azure{Seed: 1, RateScale: 2, Limit: 2}.Read(strings.NewReader(azureCSV))
	if len(half) != 2 || half[1].Arrival != reqs[1].Arrival/2 {
		t.Fatalf("limit/rate scale: %+v", half)
	}
	// The 2024 traces' timestamps carry a zone; RFC 3339 reads too.
	for _, csv := range []string{
		"TIMESTAMP,ContextTokens,GeneratedTokens\n2024-05-10 00:00:00.009930+00:00,2162,5\n2024-05-10 02:00:01.5+02:00,10,1\n",
		"2024-05-10T00:00:00.00993Z,2162,5\n2024-05-10T00:00:01.5Z,10,1\n",
	} {
		reqs, err := Azure{}.Read(strings.NewReader(csv))
		if err != nil || len(reqs) != 2 || reqs[1].Arrival != 1490070*time.Microsecond || reqs[0].PromptTokens != 2162 {
			t.Fatalf("%q: %v %+v", csv, err, reqs)
		}
	}
	// BurstGPT's form: seconds since its start, named columns in its order,
	// other columns ignored; and a header in another order.
	for _, csv := range []string{
		"Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,2162,5,2167,Conversation log\n6.49007,GPT-4,10,0,10,API log\n",
		"output_length,input_length,timestamp\n5,2162,1700000000000\n0,10,1700000001490.07\n",
	} {
		reqs, err := Azure{}.Read(strings.NewReader(csv))
		if err != nil || len(reqs) != 2 || reqs[1].Arrival.Round(time.Microsecond) != 1490070*time.Microsecond || reqs[0].PromptTokens != 2162 ||
			reqs[0].OutputTokens != 5 || reqs[1].OutputTokens != 1 {
			t.Fatalf("%q: %v %+v", csv, err, reqs)
		}
	}
	for name, bad := range map[string]string{
		"no columns": "Time,Model,Tokens\n5,m,1\n",
		"short row":  "Timestamp,Model,Request tokens,Response tokens\n5,m,1\n",
		"seconds":    "5,1,1\n-1,1,1\n",
		"timestamp":  "2023-11-16 18:15:46.6,1,1\nnope,1,1\n",
		"fields":     "2023-11-16 18:15:46.6,1\n",
		"context":    "2023-11-16 18:15:46.6,0,1\n",
		"empty":      "TIMESTAMP,ContextTokens,GeneratedTokens\n",
	} {
		if _, err := (Azure{}).Read(strings.NewReader(bad)); !errors.Is(err, ErrBadWorkload) {
			t.Errorf("%s: %v", name, err)
		}
	}
}

// TestAzureRepoTrace: the committed trace reads whole and well-formed.
func TestAzureRepoTrace(t *testing.T) {
	reqs, err := Azure{Seed: 1, Limit: 500}.ReadFile("../../testdata/traces/azure_llm_inference_2023_conv.csv")
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "azure trace", reqs)
	if h := OracleHitRate(reqs, 16); h <= 0.05 {
		t.Fatalf("oracle hit rate %.3f: synthetic prefixes missing", h)
	}
}

func FuzzAzureRead(f *testing.F) {
	f.Add(azureCSV)
	f.Add("2023-11-16 18:15:46.6,1,1\n")
	f.Add("2024-05-10 00:00:00.009930+00:00,2162,5\n")
	f.Add("TIMESTAMP,a,b\n\"x\n")
	f.Add("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n5,ChatGPT,2162,5,2167,Conversation log\n")
	f.Fuzz(func(t *testing.T, s string) {
		reqs, err := Azure{Seed: 1, Limit: 50}.Read(strings.NewReader(s))
		if err != nil {
			if !errors.Is(err, ErrBadWorkload) {
				t.Fatalf("error not wrapped: %v", err)
			}
			return
		}
		for i := range reqs {
			if reqs[i].PromptTokens <= 0 || (i > 0 && reqs[i].Arrival < reqs[i-1].Arrival) {
				t.Fatalf("accepted a bad request %+v", reqs[i])
			}
		}
	})
}

// TestLRUHitRate: with room for everything it is the oracle; with room for
// less than one group's prefix it finds nothing; in between it is between.
func TestLRUHitRate(t *testing.T) {
	reqs, err := SharedPrefix{Groups: 4, Prompts: 6, Shared: 256, Question: 32, Output: 1, Seed: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	oracle := OracleHitRate(reqs, 16)
	if got := LRUHitRate(reqs, 16, 1<<20); got != oracle {
		t.Fatalf("unbounded LRU %v, oracle %v", got, oracle)
	}
	if got := LRUHitRate(reqs, 16, 4); got != 0 {
		t.Fatalf("4 blocks: %v", got)
	}
	// Two groups' prefixes (2·16 blocks + questions) fit: a fraction of the oracle.
	if got := LRUHitRate(reqs, 16, 40); got <= 0 || got >= oracle {
		t.Fatalf("40 blocks: %v (oracle %v)", got, oracle)
	}
}

// TestTinyRateRefused: a rate whose arrivals pass the largest
// time.Duration is refused, naming the rate (before, the arrivals wrapped
// to −9.2e9 s: every request "arrived" at once before the run began and
// the throughput read 0); the smallest rates that fit still generate.
func TestTinyRateRefused(t *testing.T) {
	for _, tc := range []struct {
		name string
		gen  func(rate float64) ([]Request, error)
		want string
	}{
		{"shared-prefix", func(r float64) ([]Request, error) {
			return SharedPrefix{Groups: 2, Prompts: 4, Shared: 16, Question: 4, Output: 2, Rate: r, Seed: 1}.Generate()
		}, "rate 1e-12: request 0 would arrive"},
		{"chat", func(r float64) ([]Request, error) { return Chat{Sessions: 4, Rate: r, Seed: 1}.Generate() }, "chat rate 1e-12: session 0"},
		{"tool-agent", func(r float64) ([]Request, error) { return ToolAgent{Tasks: 4, Rate: r, Seed: 1}.Generate() }, "tool-agent rate 1e-12: task 0"},
	} {
		reqs, err := tc.gen(1e-12)
		if !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), tc.want) || !strings.Contains(err.Error(), "unit mistake") {
			t.Errorf("%s at rate 1e-12: %d requests, error %v; want one saying %q", tc.name, len(reqs), err, tc.want)
		}
		reqs, err = tc.gen(1e-6) // ~11 days apart: fits
		if err != nil {
			t.Fatalf("%s at rate 1e-6: %v", tc.name, err)
		}
		wellFormed(t, tc.name, reqs)
	}
}
