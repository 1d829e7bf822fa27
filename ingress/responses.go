package ingress

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/openai"
)

// The OpenAI Responses API (POST /v1/responses), as vLLM serves it: the
// request is routed like a chat request (vLLM renders instructions and input
// items as chat messages with the model's template, so the ingress does the
// same to key the prompt's blocks) and forwarded as it came.
//
// State. An engine keeps a stored response (store, with vLLM's
// VLLM_ENABLE_RESPONSES_API_STORE) in its own memory, so a follow-up naming
// it (previous_response_id) and GET/cancel of it must reach that engine.
// Ingress replicas are stateless: instead of a shared table the response id
// says where it lives. vLLM takes the response id from the request's
// request_id, so the ingress sets one when the client did not:
// "resp_kvm" + 16 hex digits naming the engine (FNV-1a of its id) + 32
// random hex digits, the engine digits written per attempt (a retry on
// another engine renames it). Any replica reads the engine back from the id.
// A client that sets its own request_id keeps it, and its follow-ups are
// routed on their prompt alone.

// respIDPrefix starts the response ids this ingress hands out.
const respIDPrefix = "resp_kvm"

// respTagLen is the engine tag's length in hex digits.
const respTagLen = 16

// engineTag writes the 16-hex-digit tag of engine id (FNV-1a, 64 bits)
// into dst[:16], allocating nothing.
func engineTag(dst []byte, id string) {
	h := uint64(14695981039346656037)
	for i := 0; i < len(id); i++ {
		h = (h ^ uint64(id[i])) * 1099511628211
	}
	var sum [8]byte
	binary.BigEndian.PutUint64(sum[:], h)
	hex.Encode(dst[:respTagLen], sum[:])
}

// respIDTag returns the engine tag in a response id this ingress made, or
// nil.
func respIDTag(id []byte) []byte {
	if !bytes.HasPrefix(id, []byte(respIDPrefix)) || len(id) < len(respIDPrefix)+respTagLen {
		return nil
	}
	return id[len(respIDPrefix) : len(respIDPrefix)+respTagLen]
}

// hasTag reports whether engine id's tag is tag.
func hasTag(id string, tag []byte) bool {
	var t [respTagLen]byte
	engineTag(t[:], id)
	return bytes.Equal(t[:], tag)
}

// responsesMember reads a Responses API member.
func (r *request) responsesMember(key, val []byte, koff, off int) error {
	switch string(key) {
	case "input":
		if val[0] != '"' && val[0] != '[' {
			return badRequest("input", fmt.Errorf("%w: input must be a string or an array of input items", ErrBadRequest))
		}
		r.input = val
	case "instructions":
		if val[0] != '"' && val[0] != 'n' {
			return badRequest("instructions", fmt.Errorf("%w: instructions must be a string", ErrBadRequest))
		}
		r.instructions = nil // a later member wins, null too
		if val[0] == '"' {
			r.instructions = val
		}
	case "max_output_tokens":
		r.mt = intMember(val) // settle reads it as max_tokens
	case "previous_response_id":
		if val[0] != '"' && val[0] != 'n' {
			return badRequest("previous_response_id", fmt.Errorf("%w: previous_response_id must be a string", ErrBadRequest))
		}
		r.prevResponse = r.prevResponse[:0] // a later member wins, null too
		if val[0] == '"' {
			r.prevResponse = jsonscan.AppendUnquote(r.prevResponse[:0], val)
		}
	case "request_id":
		r.hasRequestID = val[0] != 'n'
	case "tools":
		if val[0] != '[' && val[0] != 'n' {
			return badRequest("tools", fmt.Errorf("%w: tools must be an array", ErrBadRequest))
		}
		r.respTools = val
	case "tool_choice":
		r.toolChoice = val
	}
	return nil
}

// finishResponses checks a Responses request and builds the chat messages
// (and tools) vLLM renders for it into r.synth, which r.messages and
// r.tools then point into.
func (r *request) finishResponses() error {
	if len(r.input) == 0 {
		return badRequest("input", fmt.Errorf("%w: input is required", ErrBadRequest))
	}
	b := append(r.synth[:0], '[')
	n := 0
	sep := func() {
		if n > 0 {
			b = append(b, ',')
		}
		n++
	}
	if len(r.instructions) > 2 { // "" adds no system message, as in vLLM
		sep()
		b = append(b, `{"role":"system","content":`...)
		b = append(b, r.instructions...)
		b = append(b, '}')
	}
	if r.input[0] == '"' {
		sep()
		b = append(b, `{"role":"user","content":`...)
		b = append(b, r.input...)
		b = append(b, '}')
	} else {
		i := 0
		err := jsonscan.ForEachElem(r.input, func(item []byte) error {
			mark := len(b)
			sep()
			var added bool
			var err error
			if b, added, err = appendInputItem(b, item, i); err != nil {
				return err
			}
			if !added {
				b, n = b[:mark], n-1
			}
			i++
			return nil
		})
		if err != nil {
			return messagesError(err)
		}
	}
	b = append(b, ']')
	msgEnd := len(b)
	if len(r.respTools) > 0 && r.respTools[0] == '[' {
		var err error
		if b, err = appendChatTools(b, r.respTools); err != nil {
			return badRequest("tools", fmt.Errorf("%w: tools: %w", ErrBadRequest, err))
		}
		r.tools = b[msgEnd:]
	}
	r.synth = b
	r.messages = b[:msgEnd]
	r.kind = promptChat
	if n == 0 {
		if len(r.prevResponse) > 0 {
			// A stored conversation continued with no new message (a
			// function-call loop's follow-up, "go on"): the engine
			// prepends it, and the request goes where the id says, with
			// nothing here to key or count.
			r.kind = promptNone
			return nil
		}
		return badRequest("input", fmt.Errorf("%w: input has no messages", ErrBadRequest))
	}
	return r.checkMessages()
}

// appendInputItem appends input item i as the chat message vLLM makes of it:
// a message item (role and content; a content part of type input_text or
// output_text becomes a text part, an input_image stays as it is, as vLLM
// hands it to the chat parser, others are left out: the ingress only needs
// the text to key the prompt), a function_call as an assistant tool
// call, a function_call_output as a tool message. A reasoning item adds
// nothing.
func appendInputItem(b, item []byte, i int) (_ []byte, added bool, err error) {
	if item[0] != '{' {
		return b, false, badRequest(fmt.Sprintf("input[%d]", i), fmt.Errorf("%w: input[%d] must be an object", ErrBadRequest, i))
	}
	var typ, role, content, callID, name, args, output []byte
	_ = jsonscan.ForEachMember(item, func(k, v []byte, _, _ int) error {
		switch string(k) {
		case "type":
			typ = v
		case "role":
			role = v
		case "content":
			content = v
		case "call_id":
			callID = v
		case "name":
			name = v
		case "arguments":
			args = v
		case "output":
			output = v
		}
		return nil
	})
	param := func(f string) string { return fmt.Sprintf("input[%d]%s", i, f) }
	switch string(typ) {
	case `"function_call"`:
		if !isString(callID) || !isString(name) || !isString(args) {
			return b, false, badRequest(param(""), fmt.Errorf("%w: %s: a function_call needs string call_id, name and arguments", ErrBadRequest, param("")))
		}
		b = append(b, `{"role":"assistant","content":null,"tool_calls":[{"id":`...)
		b = append(b, callID...)
		b = append(b, `,"type":"function","function":{"name":`...)
		b = append(b, name...)
		b = append(b, `,"arguments":`...)
		b = append(b, args...)
		return append(b, `}}]}`...), true, nil
	case `"function_call_output"`:
		if !isString(callID) || !isString(output) {
			return b, false, badRequest(param(""), fmt.Errorf("%w: %s: a function_call_output needs string call_id and output", ErrBadRequest, param("")))
		}
		b = append(b, `{"role":"tool","content":`...)
		b = append(b, output...)
		b = append(b, `,"tool_call_id":`...)
		b = append(b, callID...)
		return append(b, '}'), true, nil
	case `"reasoning"`:
		return b, false, nil
	case `"item_reference"`:
		// vLLM renders input items as messages and keeps no items to
		// refer to (its store holds whole responses, for
		// previous_response_id): an engine would render it as an empty
		// message. The AI SDK sends these for a stored conversation's
		// earlier turns unless told not to store.
		return b, false, badRequest(param(".type"), fmt.Errorf(`%w: %s "item_reference" is not supported: the engine keeps no items to refer to; send the item itself (the Vercel AI SDK: providerOptions.openai.store = false) or continue with previous_response_id`, ErrBadRequest, param(".type")))
	case "", `"message"`:
	default:
		return b, false, badRequest(param(".type"), fmt.Errorf("%w: %s %s is not supported", ErrBadRequest, param(".type"), typ))
	}
	if !isString(role) {
		return b, false, badRequest(param(".role"), fmt.Errorf("%w: %s is required (a string)", ErrBadRequest, param(".role")))
	}
	b = append(b, `{"role":`...)
	b = append(b, role...)
	b = append(b, `,"content":`...)
	switch {
	case len(content) == 0 || content[0] == 'n':
		b = append(b, `null`...)
	case content[0] == '"':
		b = append(b, content...)
	case content[0] == '[':
		b = append(b, '[')
		parts := 0
		err := jsonscan.ForEachElem(content, func(p []byte) error {
			if p[0] != '{' {
				return badRequest(param(".content"), fmt.Errorf("%w: %s holds a non-object part", ErrBadRequest, param(".content")))
			}
			var pt, text []byte
			_ = jsonscan.ForEachMember(p, func(k, v []byte, _, _ int) error {
				switch string(k) {
				case "type":
					pt = v
				case "text":
					text = v
				}
				return nil
			})
			switch string(pt) {
			case `"input_text"`, `"output_text"`, `"text"`:
				if !isString(text) {
					return badRequest(param(".content"), fmt.Errorf("%w: %s: a text part needs a string text", ErrBadRequest, param(".content")))
				}
				if parts > 0 {
					b = append(b, ',')
				}
				parts++
				b = append(b, `{"type":"text","text":`...)
				b = append(b, text...)
				b = append(b, '}')
			case `"input_image"`:
				if parts > 0 {
					b = append(b, ',')
				}
				parts++
				b = append(b, p...) // the chat parser takes it as it is (keys stop there)
			}
			return nil
		})
		if err != nil {
			return b, false, err
		}
		b = append(b, ']')
	default:
		return b, false, badRequest(param(".content"), fmt.Errorf("%w: %s must be a string or an array of content parts", ErrBadRequest, param(".content")))
	}
	return append(b, '}'), true, nil
}

// appendChatTools appends the Responses API's function tools ({type,
// name, description, parameters}) in the chat form the template sees
// ({type, function: {...}}), as vLLM converts them; other tool types are
// left out.
func appendChatTools(b, tools []byte) ([]byte, error) {
	b = append(b, '[')
	n := 0
	err := jsonscan.ForEachElem(tools, func(t []byte) error {
		if t[0] != '{' {
			return fmt.Errorf("tools[%d] must be an object", n)
		}
		var typ, name, desc, params []byte
		_ = jsonscan.ForEachMember(t, func(k, v []byte, _, _ int) error {
			switch string(k) {
			case "type":
				typ = v
			case "name":
				name = v
			case "description":
				desc = v
			case "parameters":
				params = v
			}
			return nil
		})
		if string(typ) != `"function"` || !isString(name) {
			return nil
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, `{"type":"function","function":{"name":`...)
		b = append(b, name...)
		if isString(desc) {
			b = append(b, `,"description":`...)
			b = append(b, desc...)
		}
		if len(params) > 0 && params[0] == '{' {
			b = append(b, `,"parameters":`...)
			b = append(b, params...)
		}
		b = append(b, `}}`...)
		return nil
	})
	return append(b, ']'), err
}

func isString(v []byte) bool { return len(v) > 0 && v[0] == '"' }

// responsesBody sets the upstream body of a Responses request: the
// client's, with a request_id this ingress can route back by when the
// client sent none (its engine tag is written per attempt: stampEngine).
func (c *call) responsesBody() {
	c.path = "/v1/responses"
	if c.req.hasRequestID {
		return
	}
	var rnd [16]byte
	_, _ = rand.Read(rnd[:])
	id := make([]byte, 0, len(respIDPrefix)+respTagLen+32)
	id = append(id, respIDPrefix...)
	id = append(id, bytes.Repeat([]byte{'0'}, respTagLen)...)
	id = hex.AppendEncode(id, rnd[:])
	body := c.req.body
	end := len(body) - 1
	for end > 0 && body[end] != '}' {
		end--
	}
	c.body = append(c.body[:0], body[:end]...)
	c.body = append(c.body, `,"request_id":"`...)
	c.body = append(c.body, id...)
	c.body = append(c.body, '"')
	c.body = append(c.body, body[end:]...)
}

// stampEngine writes engine's tag into the request_id of the body an
// attempt sends.
func (c *call) stampEngine(ureq *fasthttp.Request, engine string) {
	if c.ep != epResponses || c.req.hasRequestID {
		return
	}
	stampBody(ureq.Body(), engine)
}

// stampBody writes engine's tag into the request_id responsesBody set in b.
func stampBody(b []byte, engine string) {
	at := bytes.LastIndex(b, []byte(`"request_id":"`+respIDPrefix))
	if at < 0 {
		return
	}
	at += len(`"request_id":"` + respIDPrefix)
	if at+respTagLen <= len(b) {
		engineTag(b[at:at+respTagLen], engine)
	}
}

// ResponseOwner reports whether the Responses path (/v1/responses/{id} or
// /v1/responses/{id}/cancel, query included or not) names a response id
// this project's ingress made for engine: the endpoint picker routes GET
// and cancel of a stored response to the engine holding it with it.
func ResponseOwner(path, engine string) bool {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	id, ok := strings.CutPrefix(path, "/v1/responses/")
	if !ok {
		return false
	}
	id, _, _ = strings.Cut(id, "/")
	tag := respIDTag([]byte(id))
	return tag != nil && hasTag(engine, tag)
}

// keepResponseEngine moves the engine holding previous_response_id (named by
// the id's tag) to the front of the ranking: only it has the conversation.
func (c *call) keepResponseEngine() {
	tag := respIDTag(c.req.prevResponse)
	if tag == nil {
		return
	}
	for i := range c.dec.Ranked {
		if hasTag(c.dec.Ranked[i].Engine, tag) {
			r := c.dec.Ranked[i]
			copy(c.dec.Ranked[1:i+1], c.dec.Ranked[:i])
			c.dec.Ranked[0] = r
			c.dec.Engine, c.dec.Reason = r.Engine, "response-affinity"
			return
		}
	}
}

// handleResponseByID serves GET /v1/responses/{id} and POST
// /v1/responses/{id}/cancel: the engine named by the id's tag answers; an
// id this ingress did not make, or whose engine is gone, is a 404. Every
// request is counted and access-logged (finishByID).
func (s *Server) handleResponseByID(ctx *fasthttp.RequestCtx) {
	l := byIDLine{start: time.Now(), reqID: ctx.Request.Header.Peek("X-Request-Id")}
	if !validRequestID(l.reqID) { // none, or not one to forward: as an inference request's (keepForwardHeaders)
		l.reqID = appendRequestID(nil) // upstreamhdr.go: sent upstream and logged
	}
	defer func() { s.finishByID(ctx, &l) }()
	fail := func(err error) { l.ae, l.err = writeError(ctx, err), err }
	key, err := s.identify(&ctx.Request.Header) // as an inference request (parse)
	if err != nil {
		fail(err)
		return
	}
	l.key = key
	rest := bytes.TrimPrefix(ctx.Path(), []byte("/v1/responses/"))
	id, cancel := rest, false
	if i := bytes.IndexByte(rest, '/'); i >= 0 {
		id, cancel = rest[:i], string(rest[i:]) == "/cancel"
		if !cancel {
			fail(fmt.Errorf("%w: %s %s", ErrNotFound, clipBytes(ctx.Method()), clipBytes(ctx.Path())))
			return
		}
	}
	switch {
	case cancel && !ctx.IsPost():
		fail(methodNotAllowed("POST", ctx.Method(), ctx.Path()))
		return
	case !cancel && !ctx.IsGet() && !ctx.IsHead(): // HEAD as the other GET routes (RFC 9110 §9.1)
		fail(methodNotAllowed("GET, HEAD", ctx.Method(), ctx.Path()))
		return
	}
	tag := respIDTag(id)
	var up *upstream
	if tag != nil {
		for _, e := range s.deps.Membership.Engines(nil) {
			if hasTag(e.ID, tag) {
				up, _ = s.ups.get(e.ID, e.URL)
				break
			}
		}
	}
	if up == nil {
		fail(responseNotFound(string(id)))
		return
	}
	ureq, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer fasthttp.ReleaseRequest(ureq)
	defer func() {
		if resp != nil { // else a stream's body owns it (byIDStream)
			fasthttp.ReleaseResponse(resp)
		}
	}()
	if ctx.IsHead() {
		// The engine's GET: its body's length is the HEAD's Content-Length,
		// and fasthttp sends no body to a HEAD.
		ureq.Header.SetMethod(fasthttp.MethodGet)
	} else {
		ureq.Header.SetMethodBytes(ctx.Method())
	}
	s.putUpstreamHeaders(&ureq.Header, func(i int) []byte {
		if i == fwdRequestID {
			return l.reqID
		}
		return ctx.Request.Header.Peek(forwardHeaders[i])
	})
	ureq.SetRequestURI(up.url + string(ctx.RequestURI()))
	ureq.SetHost(up.hc.Addr)
	if cancel {
		ureq.Header.SetContentType("application/json")
		ureq.SetBody(ctx.PostBody())
	}
	if err := up.hc.Do(ureq, resp); err != nil {
		if isProtocolErr(err) {
			err = errUnreadableAnswer // proxy.go
		}
		// The client reads the engine's id and the cause, the access line
		// the whole error with the engine's address (proxy.go: upstreamError).
		err = fmt.Errorf("%w: engine %s: %w", ErrUpstream, up.id, err)
		msg := clientText(err)
		if !s.cfg.EngineHeader { // an engine's id may be its address (c.fail's rule)
			msg = strings.ReplaceAll(msg, "engine "+up.id, "the engine")
		}
		fail(&upstreamError{msg: msg, err: err})
		return
	}
	l.engine = up.id
	ctx.SetStatusCode(resp.StatusCode())
	ctx.SetContentTypeBytes(resp.Header.ContentType())
	s.setEngineHeader(ctx, up.id)
	if resp.BodyStream() != nil && bytes.HasPrefix(resp.Header.ContentType(), []byte("text/event-stream")) {
		// GET ...?stream=true (a background response followed, a dropped
		// stream resumed with starting_after): the events as they come.
		ctx.Response.Header.Set("Cache-Control", "no-cache")
		setStreamBody(ctx, &byIDStream{resp: resp}) // proxy.go: close-delimited to HTTP/1.0
		resp = nil
		return
	}
	ctx.SetBody(resp.Body())
}

// byIDStream relays a stored response's event stream; fasthttp closes it
// when the client has it all or went away, which releases the engine's
// answer (and its connection).
type byIDStream struct{ resp *fasthttp.Response }

func (b *byIDStream) Read(p []byte) (int, error) { return b.resp.BodyStream().Read(p) }

func (b *byIDStream) Close() error {
	err := b.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(b.resp)
	return err
}

// appendRespErrorEvent appends the error event ending a broken Responses
// stream, numbered seq (the one after the last event relayed).
func appendRespErrorEvent(dst []byte, msg string, seq int) []byte {
	dst = append(dst, "event: error\ndata: "...)
	dst = append(dst, `{"type":"error","code":"upstream_error","message":`...)
	dst = openai.AppendString(dst, msg)
	dst = append(dst, `,"param":null,"sequence_number":`...)
	dst = strconv.AppendInt(dst, int64(seq), 10)
	return append(dst, "}\n\n"...)
}

// responseNotFound is the 404 of a stored response's id no engine holds
// (this ingress did not make it, or its engine is gone).
func responseNotFound(id string) *apiError {
	//lint:ignore ST1005 OpenAI's own message, word for word
	return newAPIError(fasthttp.StatusNotFound, "invalid_request_error", "not_found", "", fmt.Errorf("%w: Response with id '%s' not found.", ErrNotFound, clip(id)))
}
