package ingress

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/internal/tokenizer/chattmpl"
)

// The tokenize stage: the prompt's tokens as the engine will see them, and
// the upstream path and body they decide.

// tokenize fills c.tokens (when the model has a tokenizer) and decides the
// upstream path and body.
func (c *call) tokenize() error {
	defer c.wctx.stop() // the client watcher, if tokenizing started it (Stopped)
	s := c.s
	var tok Tokenizer
	if s.deps.Tokenizers != nil {
		var ok bool
		if tok, ok = s.deps.Tokenizers.For(c.model); !ok {
			if base, adapter := c.adapterOf(); adapter != "" {
				tok, _ = s.deps.Tokenizers.For(base) // an adapter tokenizes as its base model
			}
		}
	}
	var err error
	c.seqs = max(1, len(c.req.batch)) * max(1, c.req.n) // prompts (1 unless batched) × n
	if c.ep == epOther {
		c.passthrough() // passthrough.go
		return nil
	}
	switch c.req.kind {
	case promptNone: // a Responses follow-up with no new message (responses.go): routed by its id
		c.tokens = nil
		if c.ep == epResponses {
			c.responsesBody()
		}
	case promptIDs:
		if err := checkVocab(tok, c.req.ids, c.req.batch); err != nil {
			return err
		}
		c.tokens = append(c.tokens[:0], c.req.ids...)
		c.path = "/v1/completions"
		if len(c.req.batch) > 1 {
			return c.countBatchIDs()
		}
	case promptText:
		c.path = "/v1/completions"
		if len(c.req.batch) > 1 {
			if c.req.noSpecial && tok != nil && !canEncodePlain(tok) {
				tok = nil // the texts go as they came
			}
			return c.tokenizeBatch(tok)
		}
		if tok == nil || s.check.engineFirst(c.model) || c.req.noSpecial && !canEncodePlain(tok) {
			// No tokenizer here, or ours gave other ids than the engine's
			// (tokencheck.go): keyed on the engine's tokens (enginetok.go),
			// the text goes as the client wrote it.
			c.approx = len(c.req.text)/4 + 1
			if !c.tokenizeOnEngine() {
				c.tokens = nil
				return nil
			}
			break
		}
		if c.tokens, err = c.encode(tok, c.tokens[:0], c.req.text, c.tokenizeBound()); err != nil {
			if fallback, err := c.tokenizeStopped(err); fallback {
				// Over the tokenize budget: as for a prompt with no
				// tokenizer here.
				c.approx = len(c.req.text)/4 + 1
				if !c.tokenizeOnEngine() {
					c.tokens = nil
					return nil
				}
				break
			} else if err != nil {
				return err
			}
			return badRequest("prompt", fmt.Errorf("%w: tokenize prompt: %w", ErrBadRequest, err))
		}
		if !c.verifyTokens() { // tokencheck.go: c.tokens are the engine's now
			break
		}
		// Pass the tokens on so the engine does not tokenize again.
		c.body = rewritePrompt(c.body[:0], c.reqBody(), c.req.promptStart, c.req.promptEnd, c.tokens)
	case promptChat:
		c.path = "/v1/chat/completions"
		switch c.ep {
		case epResponses:
			c.responsesBody() // responses.go
		case epMessages:
			c.path = "/v1/messages" // forwarded as it came (messages.go)
		}
		if tok == nil {
			for _, m := range c.req.chatMessages() {
				c.approx += len(m.Content)/4 + 4
			}
			if !c.tokenizeOnEngine() { // enginetok.go
				c.tokens = nil
				return nil
			}
			break
		}
		if c.ep == epChat && s.check.engineFirst(c.model) && c.tokenizeOnEngine() { // tokencheck.go: our tokens disagreed with the engine's
			break
		}
		var n, media int
		if c.tokens, n, media, err = renderChat(tok, c.tokens[:0], &c.req, c.tokenizeBound()); err != nil {
			fallback, serr := c.tokenizeStopped(err)
			if serr != nil {
				return serr
			}
			if fallback || errors.Is(err, ErrNoChatTemplate) || errors.Is(err, chattmpl.ErrRender) {
				// No template, or one this interpreter failed on (not the
				// template's own raise_exception, which vLLM answers with
				// a 400 too): routed by load, for the engine to render.
				if !fallback && !errors.Is(err, ErrNoChatTemplate) {
					s.m.renderFallbacks.Inc()
					s.log.Debug("chat template failed to render here; routing unkeyed", "model", c.model, "err", err)
				}
				c.approx = len(c.req.messages) / 4
				if !c.tokenizeOnEngine() { // enginetok.go
					c.tokens = nil
					return nil
				}
				break
			}
			var ae *apiError
			if errors.As(err, &ae) {
				return err
			}
			return badRequest("messages", fmt.Errorf("%w: render chat: %w", ErrBadRequest, err))
		}
		if media > 0 {
			// Keys cover the prompt before its first media item; the
			// request goes as chat, for the engine to fetch the media.
			// The media's own tokens as learned from earlier answers.
			c.textToks, c.media = n, media
			c.promptTokens = max(1, n+int(float64(media)*s.media.perItem(c.model)+0.5))
			if len(c.tokens) == 0 {
				c.tokens = nil
			}
			break
		}
		if c.ep == epChat && !c.verifyTokens() { // tokencheck.go: c.tokens are the engine's now
			break // forwarded as chat
		}
		if s.cfg.ChatMode == ChatModeCompletions && c.ep == epChat && !c.req.chatOnly && !hasTools(c.req.tools) {
			c.path = "/v1/completions"
			c.wrap = true
			room := 0 // vLLM's chat: up to the context left after the prompt
			if left := c.contextLeft(len(c.tokens)); left > 0 {
				room = left / max(1, c.req.n)
			}
			c.body = chatToCompletionsBody(c.body[:0], c.reqBody(), &c.req, c.tokens, room)
		}
	}
	if c.tokens != nil && len(c.tokens) == 0 {
		return badRequest("prompt", fmt.Errorf("%w: prompt is empty", ErrBadRequest))
	}
	if k := c.req.truncate; k > 0 && len(c.req.batch) <= 1 { // a batch's prompts: countBatchPrompt
		// The engine keeps the last k tokens (vLLM truncates on the
		// left): the limits count, and the keys route on, what it keeps.
		c.truncateTokens()
		if c.tokens == nil && c.approx > k {
			c.approx = k
		}
		if c.promptTokens > k {
			c.promptTokens = k
		}
	}
	c.askUsage()
	return nil
}

// hasTools reports whether a request's tools member lists any.
func hasTools(tools []byte) bool {
	return len(tools) > 0 && string(tools) != "null" && string(bytes.TrimSpace(tools)) != "[]"
}

// askUsage makes a streamed request ask for the usage chunk.
func (c *call) askUsage() {
	if c.req.stream && !c.req.hasStreamOptions && c.ep != epResponses && c.ep != epMessages { // their streams end with their usage
		// Ask for the usage chunk so output tokens (metrics, rate limits,
		// access log) are exact; the proxy drops it from the client's
		// stream unless the engines send it unasked (forcedusage.go, which
		// sets c.dropUsage, or makes this request the probe that learns it).
		if !c.planUsage() {
			return
		}
		src := c.body
		if len(src) == 0 {
			src = c.req.body
		}
		c.alt = appendUsageRequest(c.alt[:0], src)
		c.body, c.alt = c.alt, c.body
	}
}

// countBatchIDs validates every token-id prompt of a batch and counts it
// (after truncate_prompt_tokens, as the engine will); the body goes
// upstream as it came. Routing keys on the first prompt (its kept tail).
func (c *call) countBatchIDs() error {
	for i, e := range c.req.batch {
		var err error
		if c.scratch, err = appendTokenIDs(c.scratch[:0], e); err != nil {
			return badRequest("prompt", fmt.Errorf("%w: prompt[%d]: invalid token ids: %w", ErrBadRequest, i, err))
		}
		if len(c.scratch) == 0 {
			return badRequest("prompt", fmt.Errorf("%w: prompt[%d] is empty", ErrBadRequest, i))
		}
		c.countBatchPrompt(i, len(c.scratch))
	}
	c.truncateTokens()
	c.askUsage()
	return nil
}

// countBatchPrompt adds a batch's prompt i, of n tokens, to c.promptTokens
// (the batch's total, which the token budgets and admission charge) and
// keeps the longest in c.longest: the prompt-length limit is per prompt, as
// vLLM checks each prompt of a batch on its own against the context
// length, after truncate_prompt_tokens. The total has no limit of its own:
// MaxBodyBytes bounds it already (every prompt costs the body at least
// about a byte per token, as text or as a JSON id list), and tokenizing a
// batch is bounded by one TokenizeBudget (tokenizeBound).
func (c *call) countBatchPrompt(i, n int) {
	if k := c.req.truncate; k > 0 && n > k {
		n = k // the engine keeps the last k tokens of each prompt
	}
	if i == 0 {
		c.promptTokens, c.longest, c.longestAt = 0, 0, 0
	}
	c.promptTokens += n
	if n > c.longest {
		c.longest, c.longestAt = n, i
	}
}

// truncateTokens keeps the last truncate_prompt_tokens of c.tokens (vLLM
// truncates on the left): the keys route on what the engine keeps.
func (c *call) truncateTokens() {
	if k := c.req.truncate; k > 0 && len(c.tokens) > k {
		c.tokens = c.tokens[len(c.tokens)-k:]
	}
}

// tokenizeBatch tokenizes every text prompt of a batch and counts each
// (countBatchPrompt); c.tokens keeps the first prompt's tokens, which
// routing keys on. The prompt is rewritten as a list of token-id lists (the
// engine does not tokenize again) only where a single prompt would be
// (tokenize): not while the model's requests use the engine's tokens
// (tokencheck.go), and not when the first prompt's ids, compared with an
// engine's /tokenize when the model is due (verifyTokens), differ. Then
// the texts go as the client wrote them, keyed on the engine's tokens for
// the first prompt (or on none when the engine cannot be asked, as a
// single prompt). Without a tokenizer the texts go as they came and the
// counts are estimates.
func (c *call) tokenizeBatch(tok Tokenizer) error {
	body := c.reqBody()
	rewrite := tok != nil && !c.s.check.engineFirst(c.model)
	if rewrite {
		c.body = append(c.body[:0], body[:c.req.promptStart]...)
		c.body = append(c.body, '[')
	}
	b := c.tokenizeBound() // one deadline for the whole batch
	for i, e := range c.req.batch {
		c.scratchText = jsonscan.AppendUnquote(c.scratchText[:0], e)
		if len(c.scratchText) == 0 {
			return badRequest("prompt", fmt.Errorf("%w: prompt[%d] is empty", ErrBadRequest, i))
		}
		if tok == nil {
			c.countBatchPrompt(i, len(c.scratchText)/4+1)
			continue
		}
		var err error
		if c.scratch, err = c.encode(tok, c.scratch[:0], c.scratchText, b); err != nil {
			if fallback, serr := c.tokenizeStopped(err); fallback {
				c.body = c.body[:0] // over the budget: the texts go as they came
				return c.tokenizeBatch(nil)
			} else if serr != nil {
				return serr
			}
			return badRequest("prompt", fmt.Errorf("%w: tokenize prompt[%d]: %w", ErrBadRequest, i, err))
		}
		if len(c.scratch) == 0 {
			return badRequest("prompt", fmt.Errorf("%w: prompt[%d] is empty", ErrBadRequest, i))
		}
		if i == 0 {
			c.tokens = append(c.tokens[:0], c.scratch...)
		}
		if rewrite {
			if i > 0 {
				c.body = append(c.body, ',')
			}
			c.body = openai.AppendTokenIDs(c.body, c.scratch)
		}
		c.countBatchPrompt(i, len(c.scratch))
	}
	switch {
	case tok == nil:
		c.tokens = nil
		c.approx = c.promptTokens
	case rewrite && c.verifyTokens(): // tokencheck.go: the first prompt's ids are the engine's
		c.body = append(c.body, ']')
		c.body = append(c.body, body[c.req.promptEnd:]...)
	default:
		// Ours gave other ids than the engine's: the texts go as the
		// client wrote them, keyed on the engine's tokens (verifyTokens
		// left them in c.tokens; engineFirst asks for them).
		c.body = c.body[:0]
		if !rewrite && !c.tokenizeOnEngine() {
			c.tokens = nil
			c.approx = c.promptTokens
		}
	}
	c.truncateTokens()
	c.askUsage()
	return nil
}

// plainEncoder is a Tokenizer that can also leave special tokens out.
type plainEncoder interface {
	EncodePlain(dst []uint32, text []byte) ([]uint32, error)
}

func canEncodePlain(tok Tokenizer) bool {
	_, ok := tok.(plainEncoder)
	return ok
}

// encode tokenizes a completions prompt as the engine will: with the
// tokenizer's special tokens unless the request's add_special_tokens is
// false; within b when the tokenizer can stop early.
func (c *call) encode(tok Tokenizer, dst []uint32, text []byte, b tokenizer.Bound) ([]uint32, error) {
	if be, ok := tok.(boundedEncoder); ok {
		return be.EncodeBounded(dst, text, !c.req.noSpecial, b)
	}
	if p, ok := tok.(plainEncoder); ok && c.req.noSpecial {
		return p.EncodePlain(dst, text)
	}
	return tok.Encode(dst, text)
}

// tokenizeBound bounds the tokenizing of a request's prompts (each of a
// batch's): past the prompt limit (promptLimit) in one prompt when the
// request will be refused anyway (no truncate_prompt_tokens), past
// TokenizeBudget from now, or once the client is gone (Stopped).
func (c *call) tokenizeBound() tokenizer.Bound {
	var b tokenizer.Bound
	if lim := c.promptLimit(); lim > 0 && c.req.truncate <= 0 {
		b.MaxTokens = lim
	}
	if d := c.s.cfg.TokenizeBudget; d > 0 {
		b.Deadline = time.Now().Add(d)
	}
	if c.wctx.rc != nil {
		b.Stop = c
	}
	return b
}

// promptLimit is the most tokens one prompt of the request may have: the
// largest max_model_len the served model's engines report (a longer prompt
// fits no engine's context, and vLLM refuses it), capped by
// MaxPromptTokens; 0: no limit (no engine reports one and no cap is set).
func (c *call) promptLimit() int {
	served, _ := c.adapterOf()
	lim := 0
	for i := range c.infos {
		if e := &c.infos[i]; e.Model == served && e.MaxModelLen > lim {
			lim = e.MaxModelLen
		}
	}
	if limit := c.s.cfg.MaxPromptTokens; limit > 0 && (lim == 0 || limit < lim) {
		lim = limit
	}
	return lim
}

// Stopped implements tokenizer.Stopper: ErrClientGone once the client
// closed its connection. The first poll (after some 64 KiB of text) starts
// the client watcher (waitCtx), which the handler stops when it returns.
func (c *call) Stopped() error {
	select {
	case <-c.wctx.Done():
		return c.wctx.Err()
	default:
		return nil
	}
}

var _ tokenizer.Stopper = (*call)(nil)

// tokenizeStopped sorts the error of an encoding its bound stopped: over
// MaxPromptTokens is the prompt-too-long error, a client that left
// ErrClientGone; over the tokenize budget is fallback: the prompt is
// routed as one this ingress cannot tokenize. Any other error is neither.
func (c *call) tokenizeStopped(err error) (fallback bool, _ error) {
	m := c.s.m
	switch {
	case errors.Is(err, tokenizer.ErrTooManyTokens):
		m.tokenizeStoppedTooLong.Inc()
		lim := c.promptLimit()
		return false, promptTooLong(c.ep, "the maximum context length is %d tokens, and the request has over %d prompt tokens", lim, lim)
	case errors.Is(err, tokenizer.ErrDeadline):
		m.tokenizeStoppedBudget.Inc()
		c.s.log.Debug("prompt over the tokenize budget; routed as untokenized", "model", c.model, "budget", c.s.cfg.TokenizeBudget)
		return true, nil
	case errors.Is(err, context.Canceled):
		m.tokenizeStoppedGone.Inc()
		return false, err
	}
	return false, nil
}
