package workload

import (
	"errors"
	"math"
	"slices"
	"testing"
	"time"
)

// commonPrefix is the length of a and b's common prefix.
func commonPrefix(a, b []uint32) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// TestCoding: deterministic by seed, well-formed; a user's turns share the
// whole repository context until an edit, which keeps at least its first
// half and replaces the tail (the history after it too); other users
// share nothing of it; history grows turn by turn between edits.
func TestCoding(t *testing.T) {
	c := Coding{Seed: 1}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "coding", reqs)
	again, _ := c.Generate()
	sameRequests(t, "coding", reqs, again)
	other, _ := Coding{Seed: 2}.Generate()
	if slices.Equal(other[0].Prompt(), reqs[0].Prompt()) {
		t.Fatal("seed 2 gives seed 1's workload")
	}
	last := map[string]*Request{}
	firstOf := map[string][]uint32{}
	kept, edits, follow := 0, 0, 0
	for i := range reqs {
		r := &reqs[i]
		p := r.Prompt()
		if r.PromptTokens < 20000+50 || r.OutputTokens < 100 || r.OutputTokens > 900 {
			t.Fatalf("request %d: prompt %d (repository ≥ 20,000 + message), output %d (100..900)", i, r.PromptTokens, r.OutputTokens)
		}
		prev, ok := last[r.Session]
		if !ok {
			for s, f := range firstOf {
				if n := commonPrefix(f, p); n >= 16 {
					t.Fatalf("user %s shares %d tokens with user %s", r.Session, n, s)
				}
			}
			firstOf[r.Session] = p
			last[r.Session] = r
			continue
		}
		follow++
		q := prev.Prompt()
		n := commonPrefix(q, p)
		switch {
		case n == len(q): // no edit: previous prompt + answer + message
			kept++
			if grow := r.PromptTokens - prev.PromptTokens - prev.OutputTokens; grow < 50 || grow > 400 {
				t.Fatalf("user %s: turn grew by %d beyond the answer, want a 50..400-token message", r.Session, grow)
			}
		default: // an edit: the first half of the repository stays, the tail does not
			edits++
			repo := len(firstOf[r.Session]) // ≥ the repository: the first turn's prompt
			if n < 10000 || n >= repo {
				t.Fatalf("user %s: an edit kept %d tokens of the previous turn's %d (first prompt %d)", r.Session, n, len(q), repo)
			}
		}
		last[r.Session] = r
	}
	if len(firstOf) != 48 || kept < follow/2 || edits < follow/5 || edits > follow/2 {
		t.Fatalf("%d users, %d follow-up turns: %d kept the context, %d edited (want ~35 %%)", len(firstOf), follow, kept, edits)
	}
	if h := OracleHitRate(reqs, 16); h < 0.7 {
		t.Fatalf("oracle hit rate %.3f: turns should reuse their repository", h)
	}
	lim, _ := Coding{Seed: 1, Limit: 10, RateScale: 2}.Generate()
	if len(lim) != 10 || lim[9].Arrival != reqs[9].Arrival/2 {
		t.Fatalf("limit/rate scale: %d requests, arrival %v vs %v", len(lim), lim[9].Arrival, reqs[9].Arrival)
	}
}

// TestRAG: deterministic, well-formed; every prompt opens with the one
// system prompt, then 3..6 documents from the pool: popular ones recur,
// in varying order, so the shared prefix past the system prompt is short.
func TestRAG(t *testing.T) {
	c := RAG{Seed: 1}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "rag", reqs)
	again, _ := c.Generate()
	sameRequests(t, "rag", reqs, again)
	// Rebuild each request's document list from its segments: the
	// generator's own record, checked against the tokens below.
	sys := reqs[0].Prompt()[:320]
	uses := map[uint64]int{}
	orders := map[string]bool{}
	for i := range reqs {
		r := &reqs[i]
		p := r.Prompt()
		if !slices.Equal(p[:320], sys) {
			t.Fatalf("request %d: no shared system prompt", i)
		}
		segs := r.src.(*segSource).segs
		docs := segs[1 : len(segs)-1]
		if len(docs) < 3 || len(docs) > 6 {
			t.Fatalf("request %d: %d documents", i, len(docs))
		}
		off := 320
		var ids []uint64
		for _, d := range docs {
			id := d.stream &^ (streamDoc << 56)
			if d.stream>>56 != streamDoc || id >= 3000 || d.n < 512 || d.n > 1536 || slices.Contains(ids, id) {
				t.Fatalf("request %d: document %x of %d tokens", i, d.stream, d.n)
			}
			for k := 0; k < d.n; k += 97 {
				if p[off+k] != token(1, d.stream, k) {
					t.Fatalf("request %d: document %d's tokens are not its own", i, id)
				}
			}
			off += d.n
			ids = append(ids, id)
			uses[id]++
		}
		if len(ids) >= 2 {
			lo, hi := min(ids[0], ids[1]), max(ids[0], ids[1])
			orders[string(rune(lo))+string(rune(hi))+map[bool]string{true: "<", false: ">"}[ids[0] < ids[1]]] = true
		}
	}
	// Popularity: the top document is in a large share of requests, and
	// many documents appear once or more.
	top := 0
	for _, n := range uses {
		top = max(top, n)
	}
	if top < len(reqs)/4 || len(uses) < 300 {
		t.Fatalf("top document in %d of %d requests, %d distinct documents: want Zipf popularity over the pool", top, len(reqs), len(uses))
	}
	// Varying order: some pair of documents appears in both orders.
	both := 0
	for k := range orders {
		if k[len(k)-1] == '<' && orders[k[:len(k)-1]+">"] {
			both++
		}
	}
	if both == 0 {
		t.Fatal("no pair of documents appears in both orders")
	}
	if h := OracleHitRate(reqs, 16); h < 0.1 || h > 0.35 {
		t.Fatalf("oracle hit rate %.3f: the shuffled order should leave only the system prompt and a first document to reuse", h)
	}
}

// TestMix: deterministic, well-formed; about LongFrac of the requests are
// long summaries (8..28k own tokens after the shared instruction), the
// rest short chat on one of 4 system prompts.
func TestMix(t *testing.T) {
	c := Mix{Seed: 1}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "mix", reqs)
	again, _ := c.Generate()
	sameRequests(t, "mix", reqs, again)
	var instr []uint32
	sys := map[int][]uint32{}
	long := 0
	for i := range reqs {
		r := &reqs[i]
		p := r.Prompt()
		switch {
		case r.PromptTokens >= 8000+256:
			long++
			if r.PromptTokens > 28000+256 || r.OutputTokens < 200 || r.OutputTokens > 700 || r.Group != 4 {
				t.Fatalf("summary %d: prompt %d, output %d, group %d", i, r.PromptTokens, r.OutputTokens, r.Group)
			}
			if instr != nil && (!slices.Equal(instr, p[:256]) || commonPrefix(instr, p) > 256+15) {
				t.Fatalf("summary %d: does not share exactly the 256-token instruction", i)
			}
			instr = p[:256]
		default:
			if r.PromptTokens < 600+64 || r.PromptTokens > 600+600 || r.OutputTokens > 2500 || r.Group < 0 || r.Group >= 4 {
				t.Fatalf("chat %d: prompt %d, output %d, group %d", i, r.PromptTokens, r.OutputTokens, r.Group)
			}
			if s, ok := sys[r.Group]; ok && !slices.Equal(s, p[:600]) {
				t.Fatalf("chat %d: system prompt %d differs", i, r.Group)
			}
			sys[r.Group] = p[:600]
		}
	}
	if len(sys) != 4 {
		t.Fatalf("%d chat system prompts", len(sys))
	}
	// The long share over seeds 1..5 (5,000 requests: sd 0.005; seed 1
	// alone draws 184 of 1,000, 3 sd high).
	n := len(reqs)
	for s := uint64(2); s <= 5; s++ {
		more, _ := Mix{Seed: s}.Generate()
		n += len(more)
		for i := range more {
			if more[i].PromptTokens >= 8000+256 {
				long++
			}
		}
	}
	if share := float64(long) / float64(n); math.Abs(share-0.15) > 0.02 {
		t.Fatalf("long share %.3f over %d requests, want ≈ 0.15", share, n)
	}
	none, _ := Mix{Seed: 1, LongFrac: -1, Requests: 200}.Generate()
	for i := range none {
		if none[i].PromptTokens > 1200 {
			t.Fatalf("LongFrac < 0: request %d has %d tokens", i, none[i].PromptTokens)
		}
	}
}

// TestShapesRefuseBadParameters: each new generator refuses what it cannot
// generate, wrapped in ErrBadWorkload, and a rate too small to fit.
func TestShapesRefuseBadParameters(t *testing.T) {
	for name, gen := range map[string]func() ([]Request, error){
		"coding repo":    Coding{RepoMin: 100, RepoMax: 50}.Generate,
		"coding rate":    Coding{Rate: -1}.Generate,
		"coding tiny":    Coding{Rate: 1e-12}.Generate,
		"coding gap":     Coding{GapMin: time.Minute}.Generate,
		"rag per":        RAG{Docs: 4}.Generate,
		"rag zipf":       RAG{ZipfS: 0.9}.Generate,
		"rag tiny":       RAG{Rate: 1e-12}.Generate,
		"mix long frac":  Mix{LongFrac: 2}.Generate,
		"mix chat out":   Mix{ChatOutMedian: 3000}.Generate,
		"mix tiny":       Mix{Rate: 1e-12}.Generate,
		"mix rate scale": Mix{RateScale: -1}.Generate,
	} {
		if reqs, err := gen(); !errors.Is(err, ErrBadWorkload) {
			t.Errorf("%s: %d requests, error %v", name, len(reqs), err)
		}
	}
	// The smallest repository, one token, still generates: an edit then
	// rewrites all of it.
	reqs, err := Coding{RepoMin: 1, RepoMax: 1, Users: 4, EditProb: 1}.Generate()
	if err != nil {
		t.Fatal(err)
	}
	wellFormed(t, "coding, 1-token repository", reqs)
}
