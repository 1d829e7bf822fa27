package sim

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// requireAPIKey is vLLM's --api-key: with a key set, a /v1 request without
// "Authorization: Bearer <key>" is a 401 {"error": "Unauthorized"}; other
// paths (/health, /metrics, /tokenize…) stay open, as in vLLM.
func (s *Server) requireAPIKey(next http.Handler) http.Handler {
	if s.cfg.APIKey == "" {
		return next
	}
	want := "Bearer " + s.cfg.APIKey
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1") && r.Method != http.MethodOptions &&
			subtle.ConstantTimeCompare([]byte(r.Header.Get("Authorization")), []byte(want)) != 1 {
			writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", s.handleCompletions)
	mux.HandleFunc("POST /v1/chat/completions", s.handleChat)
	resp := newResponsesAPI(s)
	mux.HandleFunc("POST /v1/responses", resp.create)
	mux.HandleFunc("GET /v1/responses/{id}", resp.get)
	mux.HandleFunc("POST /v1/responses/{id}/cancel", resp.cancel)
	s.messagesRoutes(mux) // POST /v1/messages, POST /v1/messages/count_tokens (messages.go)
	mux.HandleFunc("GET /v1/models", s.handleModels)
	mux.HandleFunc("POST /tokenize", s.handleTokenize)
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /version", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"version": "kvmesh-sim"})
	})
	mux.HandleFunc("POST /reset_prefix_cache", s.handleReset)
	mux.HandleFunc("POST /v1/load_lora_adapter", s.handleLoadLoRA)
	mux.HandleFunc("POST /v1/unload_lora_adapter", s.handleUnloadLoRA)
	mux.HandleFunc("GET /kvmesh/pd", s.handlePDInfo)
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.metrics.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeError(w, http.StatusNotFound, "no route "+r.Method+" "+r.URL.Path)
	})
	return s.requireAPIKey(mux)
}

// httpError carries a status to the edge.
type httpError struct {
	status int
	msg    string
}

func (e *httpError) Error() string { return e.msg }

func badRequest(format string, a ...any) error {
	return &httpError{http.StatusBadRequest, fmt.Sprintf(format, a...)}
}

// fail writes err as an OpenAI error body with the status it maps to.
func (s *Server) fail(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	var he *httpError
	switch {
	case errors.As(err, &he):
		status = he.status
	case errors.Is(err, openai.ErrBadRequest), errors.Is(err, engine.ErrBadRequest), errors.Is(err, engine.ErrTooLong):
		status = http.StatusBadRequest
	case errors.Is(err, errOverloaded):
		status = http.StatusServiceUnavailable
		s.metrics.rejected.WithLabelValues("overloaded").Inc()
	case errors.Is(err, ErrClosed):
		status = http.StatusServiceUnavailable
	}
	writeError(w, status, err.Error())
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(openai.AppendStatusError(nil, status, msg))
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		writeError(w, http.StatusInternalServerError, err.Error())
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// readRequest reads r's body, at most MaxBodyBytes, and decodes it with
// decode; any failure is an error for s.fail.
// readPDRequest reads a generation request and its P/D parameters
// (kv_transfer_params, or SGLang's bootstrap fields) from one body.
func readPDRequest[T any](s *Server, w http.ResponseWriter, r *http.Request, decode func([]byte) (T, error)) (T, *pdRequest, error) {
	var pd *pdRequest
	req, err := readRequest(s, w, r, func(b []byte) (T, error) {
		var err error
		if pd, err = s.decodePD(b); err != nil {
			var zero T
			return zero, err
		}
		return decode(b)
	})
	return req, pd, err
}

func readRequest[T any](s *Server, w http.ResponseWriter, r *http.Request, decode func([]byte) (T, error)) (T, error) {
	var zero T
	b, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return zero, &httpError{http.StatusRequestEntityTooLarge, fmt.Sprintf("request body larger than %d bytes", s.cfg.MaxBodyBytes)}
		}
		return zero, badRequest("read body: %v", err)
	}
	return decode(b)
}

func (s *Server) checkModel(model string) error {
	_, err := s.resolveModel(&model)
	return err
}

// pickRank honours X-data-parallel-rank, else takes the least loaded rank
// (fewest requests in flight; vLLM's internal DP balancing).
func (s *Server) pickRank(r *http.Request) (*rank, error) {
	if h := r.Header.Get("X-data-parallel-rank"); h != "" {
		i, err := strconv.Atoi(h)
		if err != nil || i < 0 || i >= len(s.ranks) {
			return nil, badRequest("X-data-parallel-rank %q: want 0..%d", h, len(s.ranks)-1)
		}
		return s.ranks[i], nil
	}
	best, bestN := s.ranks[0], -1
	for _, rk := range s.ranks {
		rk.mu.Lock()
		n := len(rk.calls)
		rk.mu.Unlock()
		if bestN < 0 || n < bestN {
			best, bestN = rk, n
		}
	}
	return best, nil
}

// requestID honours X-Request-Id or makes one.
func (s *Server) requestID(r *http.Request) string {
	if id := r.Header.Get("X-Request-Id"); id != "" {
		return id
	}
	return strconv.FormatUint(s.nextID.Add(1), 10)
}

// gen is one generation request as both endpoints see it.
type gen struct {
	id        string
	prompts   [][]uint32
	n         int  // sequences sampled from each prompt (0 or 1: one)
	greedy    bool // temperature 0: every sample is the prompt's own
	maxTokens int
	minTokens int
	ignoreEOS bool
	stop      []string // stop strings: the output ends at the first (stop.go)
	stopIDs   []int64  // stop_token_ids (stop.go)
	keepStop  bool     // include_stop_str_in_output
	truncate  *int     // truncate_prompt_tokens: keep each prompt's last k tokens (-1: the context length)
	salt      string
	lora      string // LoRA adapter name, "" for the base model
	stream    bool
	usage     bool // stream_options.include_usage
	contUsage bool // and continuous_usage_stats: usage on every chunk
	chat      bool
	retIDs    bool
	logprobs  int // alternatives per output token; -1: no logprobs (logprobs.go)

	// P/D (pd.go): the request's fields, and what prepare decided.
	pd           *pdRequest
	external     int     // leading prompt tokens whose KV was read from a prefill engine
	pdKey        string  // hold key of a prefill leg
	holdIfLength bool    // prefill leg: hold the blocks if it finishes by length
	prefillOnly  bool    // SGLang prefill: generate the first token only
	room         *uint64 // SGLang bootstrap room of a prefill leg
}

// submit turns g into engine calls on rank rk: one per prompt and sample,
// choice k = prompt i × n + sample j, as vLLM runs n > 1 (one engine
// request per sample; the samples after the first find the prompt cached
// once it is computed).
func (s *Server) submit(rk *rank, g *gen) ([]*call, chan struct{}, error) {
	notify := make(chan struct{}, 1)
	n := max(1, g.n)
	keep, err := s.validate(g)
	if err != nil {
		return nil, nil, err
	}
	calls := make([]*call, 0, min(len(g.prompts)*n, 64)) // MaxWaiting ends a huge batch early (503)
	for i, p := range g.prompts {
		if keep >= 0 {
			p = p[max(0, len(p)-keep):] // vLLM truncates on the left
		}
		for j := range n {
			id := g.id
			if len(g.prompts)*n > 1 {
				id += "-" + strconv.Itoa(i*n+j)
			}
			sample := j
			if g.greedy {
				sample = 0
			}
			out := outputLen(&s.cfg, p, sample, g.maxTokens, g.minTokens, g.ignoreEOS)
			cut := s.stopAt(p, sample, out, g)
			if cut.tokens > 0 {
				out = cut.tokens
			}
			c := &call{rk: rk, notify: notify, maxOut: g.maxTokens, sample: j, cut: cut, req: &engine.Request{ID: id, Prompt: p, Sample: sample,
				OutputLen: out, CacheSalt: g.salt, LoraName: g.lora}}
			g.applyPD(c)
			if err := rk.submit(c); err != nil {
				if errors.Is(err, engine.ErrDuplicateID) {
					err = badRequest("request id %q is already in flight", id)
				}
				return s.abortAll(calls), nil, err
			}
			calls = append(calls, c)
		}
	}
	return calls, notify, nil
}

// validate applies the checks of g's prompts against the context
// (truncate_prompt_tokens, an empty prompt, prompt plus output over
// max_model_len) and returns the tokens each prompt keeps
// (truncate_prompt_tokens; -1: all). vLLM's API server runs them before the
// request reaches the engine, whose scheduler is where a decode leg reads
// its KV over NIXL: a refused request reads nothing, and its prefill
// engine's blocks stay held (start runs it before the P/D read).
func (s *Server) validate(g *gen) (keep int, _ error) {
	keep = -1
	if g.truncate != nil {
		keep = *g.truncate
		if keep < 0 {
			keep = s.cfg.Engine.MaxModelLen
		}
		if keep > s.cfg.Engine.MaxModelLen {
			return -1, badRequest("truncate_prompt_tokens value (%d) is greater than max_model_len (%d). Please, select a smaller truncation size.", keep, s.cfg.Engine.MaxModelLen)
		}
	}
	for i, p := range g.prompts {
		if keep >= 0 {
			p = p[max(0, len(p)-keep):]
		}
		if len(p) == 0 {
			return -1, badRequest("prompt %d is empty", i)
		}
		if need := len(p) + g.maxTokens; need > s.cfg.Engine.MaxModelLen {
			return -1, badRequest("This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion). Please reduce the length of the messages or completion.",
				s.cfg.Engine.MaxModelLen, need, len(p), g.maxTokens)
		}
	}
	return keep, nil
}

func (s *Server) abortAll(calls []*call) []*call {
	for _, c := range calls {
		c.rk.abort(c)
	}
	return nil
}

// newGen is a generation with the sampling fields both endpoints share (no
// logprobs until the endpoint's own fields ask for them).
func newGen(id string, sp *openai.SamplingParams) *gen {
	return &gen{id: id, minTokens: sp.MinTokens, ignoreEOS: sp.IgnoreEOS, salt: sp.CacheSalt, stream: bool(sp.Stream),
		usage: sp.IncludeUsage(), contUsage: sp.ContinuousUsage(), logprobs: -1, n: sp.Samples(), greedy: sp.Greedy(),
		stop: sp.Stop, stopIDs: sp.StopTokenIDs, keepStop: sp.IncludeStopStrInOutput, truncate: sp.TruncatePromptTokens}
}

func (s *Server) handleCompletions(w http.ResponseWriter, r *http.Request) {
	req, pd, err := readPDRequest(s, w, r, openai.DecodeCompletionRequest)
	if err != nil {
		s.fail(w, err)
		return
	}
	lora, err := s.resolveModel(&req.Model)
	if err != nil {
		s.fail(w, err)
		return
	}
	g := newGen(s.requestID(r), &req.SamplingParams)
	g.maxTokens, g.retIDs, g.pd, g.lora = req.MaxOutput(), req.ReturnTokenIDs, pd, lora
	if req.Logprobs != nil {
		g.logprobs = *req.Logprobs
	}
	if len(req.Prompt.Tokens) > 0 {
		g.prompts = req.Prompt.Tokens
	} else {
		for _, t := range req.Prompt.Texts {
			g.prompts = append(g.prompts, s.tok.AppendEncode(nil, t, true))
		}
	}
	switch {
	case g.maxTokens > 0:
	case req.MaxTokensNull:
		// vLLM: up to the context left after the prompt (the longest
		// prompt of a batch here), capped as chat's is.
		longest := 0
		for _, p := range g.prompts {
			longest = max(longest, len(p))
		}
		g.maxTokens = min(s.cfg.DefaultChatMaxTokens, max(1, s.cfg.Engine.MaxModelLen-longest))
	default:
		g.maxTokens = s.cfg.DefaultMaxTokens
	}
	s.generate(w, r, g)
}

func (s *Server) handleChat(w http.ResponseWriter, r *http.Request) {
	req, pd, err := readPDRequest(s, w, r, openai.DecodeChatRequest)
	if err != nil {
		s.fail(w, err)
		return
	}
	lora, err := s.resolveModel(&req.Model)
	if err != nil {
		s.fail(w, err)
		return
	}
	prompt, err := s.chatTokens(req, false)
	if err != nil {
		s.fail(w, badRequest("render chat template: %v", err))
		return
	}
	g := newGen(s.requestID(r), &req.SamplingParams)
	g.maxTokens, g.chat, g.pd, g.lora, g.prompts = req.MaxOutput(), true, pd, lora, [][]uint32{prompt}
	if req.Logprobs {
		g.logprobs = 0
		if req.TopLogprobs != nil {
			g.logprobs = *req.TopLogprobs
		}
	}
	if g.maxTokens == 0 {
		g.maxTokens = min(s.cfg.DefaultChatMaxTokens, max(1, s.cfg.Engine.MaxModelLen-len(g.prompts[0])))
	}
	s.generate(w, r, g)
}

// start picks a rank for g, applies its P/D fields and submits it; on
// failure it has answered the client (ok false).
func (s *Server) start(w http.ResponseWriter, r *http.Request, g *gen) (rk *rank, calls []*call, notify chan struct{}, ok bool) {
	select {
	case <-s.quit:
		s.fail(w, ErrClosed)
		return nil, nil, nil, false
	default:
	}
	rk, err := s.pickRank(r)
	if err != nil {
		s.fail(w, err)
		return nil, nil, nil, false
	}
	if s.pd != nil {
		if _, err := s.validate(g); err != nil { // before the KV read, as vLLM
			s.fail(w, err)
			return nil, nil, nil, false
		}
		if err := s.pd.prepare(r.Context(), rk, g); err != nil {
			s.fail(w, err)
			return nil, nil, nil, false
		}
	}
	if calls, notify, err = s.submit(rk, g); err != nil {
		s.fail(w, err)
		return nil, nil, nil, false
	}
	w.Header().Set("X-Request-Id", g.id)
	return rk, calls, notify, true
}

// generate submits g and answers, streaming or not.
func (s *Server) generate(w http.ResponseWriter, r *http.Request, g *gen) {
	rk, calls, notify, ok := s.start(w, r, g)
	if !ok {
		return
	}
	if g.stream {
		s.streamResponse(w, r, g, calls, notify)
		return
	}
	if err := s.waitAll(r, calls, notify); err != nil {
		if errors.Is(err, ErrClosed) {
			s.fail(w, err) // the client is still there: tell it the engine went away
		}
		return
	}
	s.fullResponse(w, rk, g, calls)
}

// waitAll blocks until every call is done. It fails (aborting the calls)
// when the client goes away, the server closes (ErrClosed) or the engine
// restarts under the request (ErrClosed as well).
func (s *Server) waitAll(r *http.Request, calls []*call, notify chan struct{}) error {
	for {
		all, aborted := true, false
		for _, c := range calls {
			c.rk.mu.Lock()
			all, aborted = all && c.done, aborted || c.aborted
			c.rk.mu.Unlock()
		}
		if aborted {
			s.abortAll(calls)
			return fmt.Errorf("%w: engine restarted", ErrClosed)
		}
		if all {
			return nil
		}
		select {
		case <-notify:
		case <-r.Context().Done():
			s.abortAll(calls)
			return r.Context().Err()
		case <-s.quit:
			s.abortAll(calls)
			return ErrClosed
		}
	}
}

// snapshot is a call's state copied under its rank's lock.
type snapshot struct {
	generated int
	done      bool
	aborted   bool
	cached    int
	reason    string
}

func (c *call) snap() snapshot {
	c.rk.mu.Lock()
	defer c.rk.mu.Unlock()
	sn := snapshot{generated: c.generated, done: c.done, aborted: c.aborted, cached: c.req.CachedTokens()}
	if c.done {
		sn.reason = c.finishReason()
	}
	return sn
}

func (s *Server) usage(calls []*call) *openai.Usage {
	u := &openai.Usage{PromptTokensDetails: &openai.PromptTokensDetails{}}
	for _, c := range calls {
		sn := c.snap()
		u.CompletionTokens += sn.generated
		if c.sample == 0 { // a prompt counts once, however many samples (vLLM's usage)
			u.PromptTokens += len(c.req.Prompt)
			u.PromptTokensDetails.CachedTokens += sn.cached
		}
	}
	u.TotalTokens = u.PromptTokens + u.CompletionTokens
	return u
}

func (s *Server) fullResponse(w http.ResponseWriter, rk *rank, g *gen, calls []*call) {
	id := responseID(g)
	kv := s.pd.responseParams(rk, g, calls[0])
	if g.chat {
		resp := openai.ChatCompletion{ID: id, Object: openai.ObjectChat, Created: time.Now().Unix(), Model: s.answerModel(g), Usage: s.usage(calls)}
		for i, c := range calls {
			sn := c.snap()
			text := c.cut.clip(s.tok.Decode(c.req.OutputTokens(nil, 0, sn.generated), true), 0)
			ch := openai.ChatChoice{Index: i, Message: openai.ChatMessageOut{Role: "assistant", Content: text}, FinishReason: openai.StringPtr(sn.reason),
				StopReason: c.cut.reason()}
			if g.logprobs >= 0 {
				ch.Logprobs = s.appendChatLogprobs(nil, c.req, 0, sn.generated, g.logprobs)
			}
			resp.Choices = append(resp.Choices, ch)
		}
		writeJSON(w, http.StatusOK, withKVTransfer(resp, kv))
		return
	}
	resp := openai.Completion{ID: id, Object: openai.ObjectCompletion, Created: time.Now().Unix(), Model: s.answerModel(g), Usage: s.usage(calls)}
	for i, c := range calls {
		sn := c.snap()
		ids := c.req.OutputTokens(nil, 0, sn.generated)
		ch := openai.CompletionChoice{Index: i, Text: c.cut.clip(s.tok.Decode(ids, true), 0), FinishReason: openai.StringPtr(sn.reason),
			StopReason: c.cut.reason()}
		if g.logprobs >= 0 {
			ch.Logprobs = s.appendCompletionLogprobs(nil, c.req, 0, sn.generated, g.logprobs, 0)
		}
		if g.retIDs {
			ch.PromptTokenIDs, ch.TokenIDs = c.req.Prompt, ids
		}
		resp.Choices = append(resp.Choices, ch)
	}
	writeJSON(w, http.StatusOK, withKVTransfer(resp, kv))
}

// answerModel is the model an answer names: the LoRA adapter the request
// asked for, else the served model (vLLM's model_name(lora_request)).
func (s *Server) answerModel(g *gen) string {
	if g.lora != "" {
		return g.lora
	}
	return s.cfg.Model
}

func responseID(g *gen) string {
	if g.chat {
		return "chatcmpl-" + g.id
	}
	return "cmpl-" + g.id
}

// streamResponse writes SSE chunks as the engine produces tokens: one chunk
// per choice per engine step (several tokens when the client lags), the
// finish reason on the last, then the usage chunk and [DONE].
func (s *Server) streamResponse(w http.ResponseWriter, r *http.Request, g *gen, calls []*call, notify chan struct{}) {
	openai.SetHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	sse := openai.NewSSEWriter(w)
	f := &openai.ChunkFields{ID: responseID(g), Created: time.Now().Unix(), Model: s.answerModel(g)}
	sent := make([]int, len(calls))
	offset := make([]int, len(calls))   // characters of each choice's text sent (completions' text_offset)
	bytesOut := make([]int, len(calls)) // bytes of each choice's text sent (the stop string's cut)
	closed := make([]bool, len(calls))
	var lp []byte
	var buf []byte
	var tokBuf []uint32
	var cu openai.Usage // a chunk's usage (continuous_usage_stats)
	roleSent := false
	for {
		open := 0
		for i, c := range calls {
			if closed[i] {
				continue
			}
			sn := c.snap()
			if sn.aborted {
				_ = sse.Data(openai.AppendStatusError(buf[:0], http.StatusServiceUnavailable, "request aborted: engine restarted"))
				_ = sse.Done()
				return
			}
			if sn.generated == sent[i] && !sn.done {
				open++
				continue
			}
			tokBuf = c.req.OutputTokens(tokBuf[:0], sent[i], sn.generated)
			text := c.cut.clip(s.tok.Decode(tokBuf, true), bytesOut[i])
			bytesOut[i] += len(text)
			var stopReason []byte
			if sn.done && c.cut.tokens > 0 {
				stopReason = c.cut.reason()
			}
			lp = lp[:0]
			if g.logprobs >= 0 && sn.generated > sent[i] {
				if g.chat {
					lp = s.appendChatLogprobs(lp, c.req, sent[i], sn.generated, g.logprobs)
				} else {
					lp = s.appendCompletionLogprobs(lp, c.req, sent[i], sn.generated, g.logprobs, offset[i])
				}
			}
			offset[i] += utf8.RuneCountInString(text)
			sent[i] = sn.generated
			var err error
			if g.chat {
				if !roleSent { // vLLM opens every choice with its role before any content
					empty := ""
					roleSent = true
					for k := range calls {
						f.Usage = chunkUsage(g, &cu, calls[k], 0)
						if err = sse.Data(openai.AppendChatChunkLogprobs(buf[:0], f, k, "assistant", &empty, "", nil)); err != nil {
							s.abortAll(calls)
							return
						}
					}
				}
				f.Usage = chunkUsage(g, &cu, c, sent[i])
				buf = openai.AppendChatChunkStop(buf[:0], f, i, "", &text, sn.reason, stopReason, lp)
			} else {
				f.Usage = chunkUsage(g, &cu, c, sent[i])
				buf = openai.AppendCompletionChunkStop(buf[:0], f, i, text, sn.reason, stopReason, lp)
			}
			if err = sse.Data(buf); err != nil {
				s.abortAll(calls)
				return
			}
			if sn.done {
				closed[i] = true
			} else {
				open++
			}
		}
		if open == 0 {
			break
		}
		select {
		case <-notify:
		case <-r.Context().Done():
			s.abortAll(calls)
			return
		case <-s.quit:
			s.abortAll(calls)
			return
		}
	}
	if g.usage {
		obj := openai.ObjectCompletion
		if g.chat {
			obj = openai.ObjectChatChunk
		}
		if err := sse.Data(openai.AppendUsageChunk(buf[:0], f, obj, s.usage(calls))); err != nil {
			return
		}
	}
	_ = sse.Done()
}

// chunkUsage is the usage one chunk of choice c carries with
// continuous_usage_stats, as vLLM writes it: its prompt's tokens and the
// tokens c generated so far (no details); nil without.
func chunkUsage(g *gen, u *openai.Usage, c *call, generated int) *openai.Usage {
	if !g.contUsage {
		return nil
	}
	*u = openai.Usage{PromptTokens: len(c.req.Prompt), CompletionTokens: generated, TotalTokens: len(c.req.Prompt) + generated}
	return u
}

func (s *Server) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, openai.ModelList{Object: "list", Data: append([]openai.Model{{ID: s.cfg.Model, Object: "model",
		Created: s.created, OwnedBy: "vllm", Root: s.cfg.Model, MaxModelLen: s.cfg.Engine.MaxModelLen}}, s.loraModels()...)})
}

func (s *Server) handleTokenize(w http.ResponseWriter, r *http.Request) {
	req, err := readRequest(s, w, r, openai.DecodeTokenizeRequest)
	if err != nil {
		s.fail(w, err)
		return
	}
	if req.Model != "" {
		if err := s.checkModel(req.Model); err != nil {
			s.fail(w, err)
			return
		}
	}
	var ids []uint32
	if len(req.Messages) > 0 {
		if ids, err = s.chatTokens(req.Chat(), req.AddSpecialTokens != nil && *req.AddSpecialTokens); err != nil {
			s.fail(w, badRequest("render chat template: %v", err))
			return
		}
	} else {
		ids = s.tok.AppendEncode(nil, req.Prompt, req.AddSpecialTokens == nil || *req.AddSpecialTokens)
	}
	if ids == nil {
		ids = []uint32{}
	}
	writeJSON(w, http.StatusOK, openai.TokenizeResponse{Count: len(ids), MaxModelLen: s.cfg.Engine.MaxModelLen, Tokens: ids})
}

// handleReset is POST /reset_prefix_cache[?reset_running_requests=true]:
// with the flag, running requests are preempted first (newer vLLM), so the
// reset always succeeds; without it, it fails with 409 while requests hold
// blocks (vLLM refuses too, but answers 200 and only logs a warning).
func (s *Server) handleReset(w http.ResponseWriter, r *http.Request) {
	v := r.URL.Query().Get("reset_running_requests")
	if err := s.resetPrefixCache(v == "true" || v == "True" || v == "1"); err != nil {
		writeError(w, http.StatusConflict, err.Error())
		return
	}
	w.WriteHeader(http.StatusOK)
}
