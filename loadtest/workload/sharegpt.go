package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"strconv"
	"time"
)

// ShareGPT reads a ShareGPT-format dataset (vLLM's and SGLang's serving
// benchmarks use ShareGPT_V3_unfiltered_cleaned_split.json) as multi-turn
// sessions: a JSON array of conversations, each {"conversations": [{"from":
// "human"|"gpt"|…, "value": text}, …]} (also "conversation", or OpenAI-style
// "messages" of {"role", "content"}). Every assistant turn that follows a
// user turn is a request: its prompt is the conversation so far (system
// turns, every earlier turn and the answers given), its output the answer's
// length, so a conversation's turns share their prefix as a chat client's
// do. Lengths are estimated from the text, one token per Bytes bytes (the
// dataset has text, not token ids; 4 by default, the usual rule of thumb
// for English), and the tokens are drawn per conversation and turn.
//
// Sessions start as a Poisson process at Rate per second and their turns
// are Think apart (exponential), open-loop as Chat's (a turn arrives Think
// after the previous turn's arrival).
type ShareGPT struct {
	// Rate is session starts per second (default 5); Think the mean time
	// between a session's turns (default 10 s).
	Rate  float64
	Think time.Duration
	// Bytes of text per token (default 4).
	Bytes float64
	// MaxContext ends a session whose next prompt plus answer would exceed
	// it (default 32,768).
	MaxContext int
	// Conversations reads only the first Conversations (0: all).
	Conversations int
	// RateScale divides every arrival time (0: 1); Limit keeps the first
	// Limit requests (0: all).
	RateScale float64
	Limit     int
	// Seed fixes arrivals and tokens.
	Seed uint64
}

// shareGPTConv is one conversation of the dataset, in any of its forms.
type shareGPTConv struct {
	Conversations []shareGPTTurn `json:"conversations"`
	Conversation  []shareGPTTurn `json:"conversation"`
	Messages      []shareGPTTurn `json:"messages"`
}

type shareGPTTurn struct {
	From    string `json:"from"`
	Value   string `json:"value"`
	Role    string `json:"role"`
	Content string `json:"content"`
}

// role is the turn's speaker as "system", "user" or "assistant" ("" for
// one the dataset's variants do not name).
func (t *shareGPTTurn) role() string {
	r := t.From
	if r == "" {
		r = t.Role
	}
	switch r {
	case "system":
		return "system"
	case "human", "user":
		return "user"
	case "gpt", "chatgpt", "bard", "bing", "assistant", "model":
		return "assistant"
	}
	return ""
}

func (t *shareGPTTurn) text() string {
	if t.Value != "" {
		return t.Value
	}
	return t.Content
}

// ReadFile reads the dataset at path.
func (s ShareGPT) ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: sharegpt: %w", ErrBadWorkload, err)
	}
	defer f.Close()
	return s.Read(f)
}

// Read reads the dataset from r, one conversation at a time (the full
// dataset is 640 MB).
func (s ShareGPT) Read(r io.Reader) ([]Request, error) {
	if s.Rate == 0 {
		s.Rate = 5
	}
	if s.Think == 0 {
		s.Think = 10 * time.Second
	}
	if s.Bytes == 0 {
		s.Bytes = 4
	}
	if s.MaxContext == 0 {
		s.MaxContext = 32768
	}
	if !(s.Rate > 0) || s.Think < 0 || !(s.Bytes > 0) || s.MaxContext < 2 || s.MaxContext > MaxTraceTokens || s.Conversations < 0 {
		return nil, fmt.Errorf("%w: sharegpt rate %v must be > 0, think %v ≥ 0, bytes %v > 0, max context %d in 2..%d (workload.MaxTraceTokens), conversations %d ≥ 0",
			ErrBadWorkload, s.Rate, s.Think, s.Bytes, s.MaxContext, MaxTraceTokens, s.Conversations)
	}
	r, err := traceText(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bufio.NewReaderSize(r, 1<<20))
	switch tok, err := dec.Token(); {
	case err != nil:
		return nil, fmt.Errorf("%w: sharegpt: want a JSON array of conversations (%v)", ErrBadWorkload, err)
	case tok != json.Delim('['):
		return nil, fmt.Errorf("%w: sharegpt: want a JSON array of conversations, the file starts with %s (one object per line is a Mooncake trace's form)", ErrBadWorkload, describeToken(tok))
	}
	rng := rand.New(rand.NewPCG(s.Seed, 0x5a4e))
	var reqs []Request
	var start time.Duration
	for n := 0; dec.More() && (s.Conversations == 0 || n < s.Conversations); n++ {
		var c shareGPTConv
		if err := dec.Decode(&c); err != nil {
			return nil, fmt.Errorf("%w: sharegpt conversation %d: %w", ErrBadWorkload, n, err)
		}
		turns := c.Conversations
		if len(turns) == 0 {
			turns = c.Conversation
		}
		if len(turns) == 0 {
			turns = c.Messages
		}
		start += expDur(rng, time.Duration(float64(time.Second)/s.Rate))
		reqs = s.session(reqs, turns, n, start, rng)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: sharegpt: no conversation with a user turn answered", ErrBadWorkload)
	}
	return finish(reqs, s.RateScale, s.Limit)
}

// session appends conversation n's requests, its first turn at start.
func (s ShareGPT) session(reqs []Request, turns []shareGPTTurn, n int, start time.Duration, rng *rand.Rand) []Request {
	var segs []segment
	at, asked, sent := start, false, 0
	id := uint64(n) << 20 // and the turn's index in the low bits
	for k := range turns {
		t := &turns[k]
		tokens := max(1, int(float64(len(t.text()))/s.Bytes+0.5))
		switch t.role() {
		case "system", "user":
			kind := streamUser
			if t.role() == "system" {
				kind = streamSystem
			}
			segs = append(segs, seg(kind, id|uint64(k)&(1<<20-1), tokens))
			asked = t.role() == "user"
		case "assistant":
			if asked {
				if segTokens(segs)+tokens > s.MaxContext {
					return reqs
				}
				if sent > 0 {
					at += expDur(rng, s.Think)
				}
				reqs = append(reqs, Request{Arrival: at, PromptTokens: segTokens(segs), OutputTokens: tokens, Group: -1,
					Session: "sg" + strconv.Itoa(n), src: &segSource{seed: s.Seed, segs: segs[:len(segs):len(segs)]}})
				sent++
			}
			segs = append(segs, seg(streamAnswer, id|uint64(k)&(1<<20-1), tokens))
			asked = false
		}
	}
	return reqs
}

// describeToken names the first JSON token of a file that is not an array.
func describeToken(tok json.Token) string {
	switch v := tok.(type) {
	case json.Delim:
		return fmt.Sprintf("%q", string(v))
	case string:
		return "a string"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%v", tok)
}
