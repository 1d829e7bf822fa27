package epp

import (
	"bytes"
	"errors"
	"io"
	"slices"
	"strconv"
	"strings"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/scheduler"
)

// Process serves one ext_proc stream: the data plane opens one per HTTP
// request. Message order follows the body mode the data plane runs:
//
//   - FULL_DUPLEX_STREAMED (GAIE): headers and body chunks arrive without
//     waiting; at the body's end (or the trailers) the picker answers the
//     headers (destination, metadata), then the body (sent back whole; the
//     data plane forwards only what comes back), then the trailers.
//   - BUFFERED: the headers get an empty answer at once (the data plane
//     waits for it), the whole body comes in one message and its answer
//     carries the destination.
//   - STREAMED with send_body_without_waiting_for_header_response: like
//     full duplex, but every body chunk gets its own answer: empty (pass),
//     or, when the body is replaced, the whole new body in the first
//     chunk's and a cleared chunk in the others.
//
// The response side only keeps the books: the endpoint that served
// (x-gateway-destination-endpoint-served), the first byte, the end.
func (s *Server) Process(stream extprocv3.ExternalProcessor_ProcessServer) error {
	x := s.xs.Get().(*exchange)
	x.reset()
	s.m.streams.Inc()
	defer s.finish(x)
	for {
		req, err := stream.Recv()
		if err != nil {
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
		if req.GetRequest() == nil {
			// No phase to answer: waiting for the next message would leave
			// the data plane waiting on this one.
			s.m.results.WithLabelValues("bad_message").Inc()
			return status.Error(codes.InvalidArgument, "ext_proc: a ProcessingRequest without a request or response phase")
		}
		if bad := x.outOfOrder(req); bad != "" {
			// Answering it would answer a phase the data plane never
			// opened (or a request it did not send on this stream).
			s.m.results.WithLabelValues("bad_message").Inc()
			return status.Error(codes.InvalidArgument, "ext_proc: "+bad)
		}
		t := time.Now()
		x.out = x.out[:0]
		was := x.answered
		done := x.handle(req)
		if !was && x.answered {
			// What the picker adds: the message that completed the request
			// received → its routing answer handed to gRPC (x.out[0]).
			d := time.Since(t)
			s.m.pick.Observe(d.Seconds())
			if s.onPick != nil {
				s.onPick(d)
			}
		}
		for _, r := range x.out {
			if err := stream.Send(r); err != nil {
				return err
			}
		}
		if done {
			return nil
		}
	}
}

// finish ends the stream's exchange whichever way the stream ended (the
// response's end, the data plane's cancel, an error): its decision and its
// body budget are released, and it goes back to the pool without a large
// body buffer.
func (s *Server) finish(x *exchange) {
	if x.picked != nil && x.status != 0 && x.respMode != extprocfilter.ProcessingMode_NONE {
		// The answer began and the stream ended before its end came: the
		// client left, or the data plane cut it.
		x.status = ingress.StatusClientClosed
	}
	x.end()
	x.releaseBody()
	s.m.streams.Dec()
	x.shrink()
	s.xs.Put(x)
}

// exchange is one request's state on its stream; pooled per stream.
type exchange struct {
	s *Server

	first     bool
	headers   bool // the request headers came
	reqMode   extprocfilter.ProcessingMode_BodySendMode
	respMode  extprocfilter.ProcessingMode_BodySendMode
	noWait    bool // STREAMED: the data plane sends the body without waiting for the headers' answer
	path      string
	method    string
	kind      pathKind
	ep        string            // the endpoint's own path (classifyPath)
	in        ingress.PickInput // the endpoint, for Pick
	auth      []byte
	apiKey    []byte
	authN     int // Authorization headers received
	apiKeyN   int // X-Api-Key headers received
	session   []byte
	reqID     []byte // the X-Request-Id header
	newReqID  string // the request id the picker made (none came, or not one to forward): set for the engine
	subset    []string
	hasSubset bool
	body      []byte
	held      int64  // body bytes charged to the ingress's body budget (released at the stream's end)
	length    int    // the request's content-length; -1: none (or not a number)
	encoding  string // its content-encoding; "": none or identity
	partial   bool   // BUFFERED_PARTIAL sent the body without end_of_stream: it may be cut at the data plane's buffer
	newBody   bool   // body was replaced for the engine (decoded, or a Responses request_id): sent in its place
	decoded   bool   // body is the decoded one: the content-encoding header goes
	chunks    int    // request body messages received
	answered  bool   // the request side has its destination

	picked  *ingress.Picked
	dests   []string    // endpoints in fallback order
	engines []string    // parallel to dests
	status  int         // response :status
	ans     answerLines // the answer's lines, read for its usage (Picked.Answer)
	out     []*extprocv3.ProcessingResponse
}

func (x *exchange) reset() {
	ans := x.ans.part
	*x = exchange{s: x.s, first: true, length: -1, body: x.body[:0], subset: x.subset[:0], dests: x.dests[:0],
		engines: x.engines[:0], out: x.out[:0], auth: x.auth[:0], apiKey: x.apiKey[:0], session: x.session[:0],
		reqID: x.reqID[:0]}
	x.ans.part = ans[:0]
}

// maxPooledBody is the largest body buffer a pooled exchange keeps: the
// next stream reuses it, but a few large bodies must not pin their
// capacity in every pooled exchange once they are over.
const maxPooledBody = 1 << 20

// maxPooledAnswerLine is the largest answer line buffer a pooled exchange
// keeps (answerLines: a streamed answer's lines are short).
const maxPooledAnswerLine = 16 << 10

// shrink readies x for the pool: a large body buffer is dropped, and the
// answers sent (which point into the body) are let go.
func (x *exchange) shrink() {
	if cap(x.body) > maxPooledBody {
		x.body = nil
	}
	if cap(x.ans.part) > maxPooledAnswerLine {
		x.ans.part = nil
	}
	clear(x.out[:cap(x.out)])
	x.out = x.out[:0]
}

// holdBody charges n more body bytes to the ingress's body budget
// (--max-body-in-flight, shared with every other stream); false: refused,
// and the refusal is answered.
func (x *exchange) holdBody(n int) bool {
	if err := x.s.ing.HoldBody(x.held, n); err != nil {
		x.budgetRefused(err)
		return false
	}
	if n > 0 {
		x.held += int64(n)
	}
	return true
}

// budgetRefused answers a body budget refusal (ingress HoldBody,
// DecodedRefused); true, as reject.
func (x *exchange) budgetRefused(err error) bool {
	x.s.m.results.WithLabelValues("overloaded").Inc()
	var pe *ingress.PickError
	if errors.As(err, &pe) {
		return x.reject(pe.Status, pe.Body, pe.RetryAfter, "kvmesh_epp_body_budget")
	}
	return x.reject(503, openai.AppendError(nil, err.Error(), "server_error", "", "ingress_body_budget_exhausted"), 1, "kvmesh_epp_body_budget")
}

// releaseBody gives the body's charge back; the stream's end calls it
// whichever way the stream ended.
func (x *exchange) releaseBody() {
	x.s.ing.ReleaseBody(x.held)
	x.held = 0
}

// handle appends the answers to req to x.out; true ends the stream.
func (x *exchange) handle(req *extprocv3.ProcessingRequest) bool {
	if x.first {
		x.first = false
		x.modes(req.GetProtocolConfig())
	}
	switch r := req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestHeaders:
		return x.requestHeaders(req, r.RequestHeaders)
	case *extprocv3.ProcessingRequest_RequestBody:
		return x.requestBody(r.RequestBody)
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return x.requestTrailers()
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		x.responseHeaders(req, r.ResponseHeaders)
	case *extprocv3.ProcessingRequest_ResponseBody:
		x.responseBody(r.ResponseBody)
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		x.out = append(x.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
			ResponseTrailers: &extprocv3.TrailersResponse{}}})
		x.end()
	}
	return false
}

// outOfOrder says what is wrong with req's place on the stream ("": in
// order): every phase follows the request headers, and a stream carries one
// request (Envoy opens one per HTTP request).
func (x *exchange) outOfOrder(req *extprocv3.ProcessingRequest) string {
	_, isHeaders := req.GetRequest().(*extprocv3.ProcessingRequest_RequestHeaders)
	switch {
	case isHeaders && x.headers:
		return "a second request's headers on one stream (a stream carries one HTTP request)"
	case isHeaders:
		x.headers = true
		return ""
	case !x.headers:
		return "a " + phaseName(req) + " before the request headers"
	}
	return ""
}

func phaseName(req *extprocv3.ProcessingRequest) string {
	switch req.GetRequest().(type) {
	case *extprocv3.ProcessingRequest_RequestBody:
		return "request body"
	case *extprocv3.ProcessingRequest_RequestTrailers:
		return "request trailers"
	case *extprocv3.ProcessingRequest_ResponseHeaders:
		return "response headers"
	case *extprocv3.ProcessingRequest_ResponseBody:
		return "response body"
	case *extprocv3.ProcessingRequest_ResponseTrailers:
		return "response trailers"
	}
	return "message"
}

// modes takes the body modes from protocol_config, else the configured default.
func (x *exchange) modes(pc *extprocv3.ProtocolConfiguration) {
	if pc != nil {
		x.reqMode, x.respMode = pc.GetRequestBodyMode(), pc.GetResponseBodyMode()
		x.noWait = pc.GetSendBodyWithoutWaitingForHeaderResponse()
		return
	}
	switch x.s.cfg.DefaultBodyMode {
	case ModeBuffered:
		x.reqMode, x.respMode = extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_NONE
	case ModeStreamed:
		x.reqMode, x.respMode, x.noWait = extprocfilter.ProcessingMode_STREAMED, extprocfilter.ProcessingMode_STREAMED, true
	default:
		x.reqMode, x.respMode = extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
	}
}

func (x *exchange) requestHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) bool {
	for _, hv := range h.GetHeaders().GetHeaders() {
		switch hv.GetKey() {
		case ":path":
			x.path = headerValue(hv)
		case ":method":
			x.method = headerValue(hv)
		case "authorization":
			x.auth = append(x.auth[:0], headerValue(hv)...)
			x.authN++
		case "x-api-key":
			x.apiKey = append(x.apiKey[:0], headerValue(hv)...)
			x.apiKeyN++
		case "x-session-id":
			x.session = append(x.session[:0], headerValue(hv)...)
		case "x-request-id":
			x.reqID = append(x.reqID[:0], headerValue(hv)...)
		case "content-length":
			x.length = parseContentLength(headerValue(hv))
		case "content-encoding":
			x.encoding = contentEncoding(headerValue(hv))
		}
	}
	x.kind, x.ep, x.in = classifyPath(x.path)
	var bad int
	x.subset, x.hasSubset, bad = metadataEndpoints(req.GetMetadataContext(), SubsetNamespace, SubsetKey)
	if bad > 0 {
		x.s.m.badMetadata.WithLabelValues(SubsetKey).Add(float64(bad))
	}
	if x.refusedMethod() {
		return true
	}
	// The credential first, as the ingress reads it before the body: a
	// caller that may not send is refused before its body is buffered or
	// charged to the body budget.
	if x.refusedAuth(x.repeatedCredential()) {
		return true
	}
	if x.kind == pathModels {
		return x.answerModels()
	}
	if h.GetEndOfStream() || x.reqMode == extprocfilter.ProcessingMode_NONE {
		// No body will come: route on load alone.
		return x.routeUnpicked(func(dest, _ string) {
			r := headersResponse(x.routeCommon(dest, ""))
			r.DynamicMetadata = destinationMetadata(dest)
			x.out = append(x.out, r)
		})
	}
	switch x.reqMode {
	case extprocfilter.ProcessingMode_STREAMED:
		if !x.noWait {
			// The data plane holds the body until the headers are answered,
			// and the headers pick the route: nothing to pick on.
			x.s.m.results.WithLabelValues("bad_mode").Inc()
			return x.reject(500, openai.AppendError(nil, "the gateway's ext_proc filter runs the request body in STREAMED mode without send_body_without_waiting_for_header_response: the endpoint picker cannot read the body before routing; use FULL_DUPLEX_STREAMED (GAIE) or BUFFERED", "server_error", "", "epp_misconfigured"), 0, "kvmesh_epp_unsupported_body_mode")
		}
	case extprocfilter.ProcessingMode_GRPC:
		x.s.m.results.WithLabelValues("bad_mode").Inc()
		return x.reject(500, openai.AppendError(nil, "ext_proc GRPC body mode is not an OpenAI request", "server_error", "", "epp_misconfigured"), 0, "kvmesh_epp_unsupported_body_mode")
	}
	// A body that says its size is refused or charged before it comes:
	// past --max-body it never fits, and a whole message of it (BUFFERED)
	// sits in gRPC's buffers before the picker could charge it chunk by
	// chunk. Its chunks are charged past what was reserved.
	if x.length > x.s.cfg.MaxBodyBytes {
		return x.tooLarge("")
	}
	if x.length > 0 && !x.holdBody(x.length) {
		return true
	}
	switch x.reqMode {
	case extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_BUFFERED_PARTIAL:
		x.out = append(x.out, headersResponse(&extprocv3.CommonResponse{}))
	}
	return false
}

func (x *exchange) requestBody(b *extprocv3.HttpBody) bool {
	if x.answered {
		return false // nothing after the answer in these modes; ignore strays
	}
	x.chunks++
	if len(x.body)+len(b.GetBody()) > x.s.cfg.MaxBodyBytes {
		return x.tooLarge("")
	}
	if more := int64(len(x.body)+len(b.GetBody())) - x.held; more > 0 && !x.holdBody(int(more)) {
		return true
	}
	x.body = append(x.body, b.GetBody()...)
	switch x.reqMode {
	case extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_BUFFERED_PARTIAL:
		// One message holds the whole body (trailers, if any, follow) — in
		// BUFFERED_PARTIAL without end_of_stream, the whole body that
		// trailers follow or the first buffer-full of a larger one, which
		// route tells apart (the rest would never reach the picker).
		x.partial = !b.GetEndOfStream() && x.reqMode == extprocfilter.ProcessingMode_BUFFERED_PARTIAL
		return x.route(func(dest, pre string) {
			common := x.withBody(x.routeCommon(dest, pre))
			if x.newBody {
				common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: x.body}}
			}
			r := bodyResponse(common)
			r.DynamicMetadata = destinationMetadata(dest)
			x.out = append(x.out, r)
		})
	}
	if !b.GetEndOfStream() {
		return false
	}
	return x.routeStreamed(true)
}

// requestTrailers ends a body whose last chunk did not say so.
func (x *exchange) requestTrailers() bool {
	if !x.answered {
		switch x.reqMode {
		case extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_STREAMED:
			if x.routeStreamed(false) {
				return true
			}
		case extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_BUFFERED_PARTIAL:
			// Trailers and no body: the headers were answered (empty) before
			// it was known none would come, so the route can only go in the
			// trailers answer's metadata now (no header mutation there
			// reaches the request headers); an inference route gets the
			// ingress's refusal of an empty body.
			return x.route(func(dest, _ string) {
				r := trailersResponse()
				r.DynamicMetadata = destinationMetadata(dest)
				x.out = append(x.out, r)
			})
		}
	}
	x.out = append(x.out, trailersResponse())
	return false
}

// routeStreamed answers the held headers with the destination, then the body.
func (x *exchange) routeStreamed(eos bool) bool {
	return x.route(func(dest, pre string) {
		r := headersResponse(x.withBody(x.routeCommon(dest, pre)))
		r.DynamicMetadata = destinationMetadata(dest)
		x.out = append(x.out, r)
		if x.reqMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED {
			x.out = append(x.out, bodyResponse(streamedBody(x.body, eos)))
			return
		}
		for i := range x.chunks {
			// STREAMED: each chunk waits for its answer, so a replaced body
			// goes out whole in the first chunk's place and the others are
			// cleared; otherwise the chunks pass as they came.
			common := &extprocv3.CommonResponse{}
			switch {
			case x.newBody && i == 0:
				common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_Body{Body: x.body}}
			case x.newBody:
				common.BodyMutation = &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_ClearBody{ClearBody: true}}
			}
			x.out = append(x.out, bodyResponse(common))
		}
	})
}

// routeCommon is the routing answer (routeCommon) with the engines'
// credentials: with client authentication on, the client's Authorization
// and X-Api-Key stay at the gateway, as the ingress keeps them
// (docs/SECURITY.md); with an engine API key, the engine gets its
// "Authorization: Bearer <key>" in their place (authentication on or off).
// With neither, the headers go on as the client sent them (the gateway
// may rely on them). A request id the picker made goes to the engine as
// X-Request-Id.
func (x *exchange) routeCommon(dest, pre string) *extprocv3.CommonResponse {
	common := routeCommon(dest, pre)
	hm := common.HeaderMutation
	s := x.s
	if s.engineAuth != "" {
		// Set over the client's (OVERWRITE_IF_EXISTS_OR_ADD), not also
		// removed: a removal of the header set would depend on the order
		// the data plane applies the two lists in.
		hm.SetHeaders = append(hm.SetHeaders, setHeader("authorization", s.engineAuth))
	} else if s.authOn {
		hm.RemoveHeaders = append(hm.RemoveHeaders, "authorization")
	}
	if s.authOn {
		hm.RemoveHeaders = append(hm.RemoveHeaders, "x-api-key")
	}
	if x.newReqID != "" {
		hm.SetHeaders = append(hm.SetHeaders, setHeader("x-request-id", x.newReqID))
	}
	return common
}

// withBody adds the replaced body's content-length to the route's header
// mutation (the headers go upstream with the answer carrying it), and
// removes the content-encoding of a body sent decoded.
func (x *exchange) withBody(common *extprocv3.CommonResponse) *extprocv3.CommonResponse {
	if x.newBody {
		common.HeaderMutation.SetHeaders = append(common.HeaderMutation.SetHeaders, setHeader("content-length", strconv.Itoa(len(x.body))))
	}
	if x.decoded {
		common.HeaderMutation.RemoveHeaders = append(common.HeaderMutation.RemoveHeaders, "content-encoding")
	}
	return common
}

// route picks for the buffered body and lets answer build the messages
// (dest: the comma-separated fallback list; pre: the prefiller or "").
func (x *exchange) route(answer func(dest, pre string)) bool {
	if x.kind == pathResponseByID {
		// No body to decide on (a cancel's is the engine's to read):
		// authenticated, then to its engine, then by load.
		return x.routeUnpicked(answer)
	}
	if x.partial && x.length >= 0 && len(x.body) < x.length {
		return x.truncated()
	}
	if x.encoding != "" && x.decode() {
		return true
	}
	if x.partial && x.length < 0 && !jsonComplete(x.body) {
		// No content-length to compare with: a body that is not one whole
		// JSON value was cut at the data plane's buffer (or is malformed).
		return x.truncated()
	}
	if rep := x.repeatedCredential(); rep != "" {
		if x.refusedAuth(rep) {
			return true
		}
	}
	// Every other path with a body is what the ingress serves as a
	// passthrough request (x.in.Other): authenticated, limited, admitted,
	// and routed by load among the engines of the body's model.
	in := x.in
	in.Path, in.Body, in.Authorization, in.SessionID, in.APIKey, in.RequestID = []byte(x.ep), x.body, x.auth, x.session, x.apiKey, x.reqID
	p, err := x.s.ing.Pick(in)
	if err != nil {
		var pe *ingress.PickError
		switch {
		case errors.Is(err, ingress.ErrNoEngine):
			// No live engine (of the pool) for it: the protocol's 503, as
			// for a bodyless request.
			return x.noEndpoint(err.Error())
		case errors.As(err, &pe):
			x.s.m.results.WithLabelValues("rejected").Inc()
			return x.reject(pe.Status, pe.Body, pe.RetryAfter, "kvmesh_epp_rejected")
		}
		return x.reject(500, openai.AppendError(nil, err.Error(), "server_error", "", "internal_error"), 0, "kvmesh_epp_error")
	}
	x.picked = p
	// The request's id in the access log is the data plane's X-Request-Id
	// (as GAIE's picker names a request: in.RequestID), or, without a valid
	// one, one the picker makes and sends the engine, so the picker's line,
	// the gateway's and the engine's name the request alike.
	if id := p.RequestID(); !bytes.Equal(id, x.reqID) {
		x.newReqID = string(id)
	}
	pre := x.fillDests(p)
	if len(x.dests) == 0 || p.Start(x.engines[0]) != nil {
		return x.noEndpoint("")
	}
	if b := p.Body(x.engines[0]); b != nil {
		// Sent in place of the client's.
		x.body, x.newBody = append(x.body[:0], b...), true
	}
	x.answered = true
	answer(joinEndpoints(x.dests), pre)
	x.s.m.results.WithLabelValues("routed").Inc()
	return false
}

// repeatedCredential names a credential header the request carried more
// than once ("": none); the ingress refuses those when authentication is on
// (which one counts would depend on the reader).
func (x *exchange) repeatedCredential() string {
	switch {
	case x.authN > 1:
		return "Authorization"
	case x.apiKeyN > 1:
		return "X-Api-Key"
	}
	return ""
}

// refusedAuth authenticates a request as the ingress's request path does
// (every request it routes is: docs/SECURITY.md); true: refused and
// answered.
func (x *exchange) refusedAuth(repeated string) bool {
	err := x.s.ing.Authenticate(ingress.PickInput{Path: []byte(x.ep), Authorization: x.auth, APIKey: x.apiKey}, repeated)
	if err == nil {
		return false
	}
	x.s.m.results.WithLabelValues("rejected").Inc()
	var pe *ingress.PickError
	if errors.As(err, &pe) {
		return x.reject(pe.Status, pe.Body, pe.RetryAfter, "kvmesh_epp_rejected")
	}
	return x.reject(500, openai.AppendError(nil, err.Error(), "server_error", "", "internal_error"), 0, "kvmesh_epp_error")
}

// routeUnpicked routes a request without a body to decide on (none came, or
// a stored response's GET or cancel) by load; its credential
// passed at its headers (requestHeaders).
func (x *exchange) routeUnpicked(answer func(dest, pre string)) bool {
	return x.routeByLoad(answer)
}

// routeByLoad routes a request the ingress does not decide (no body, or a
// stored response) to the least-loaded engines of the pool.
func (x *exchange) routeByLoad(answer func(dest, pre string)) bool {
	s := x.s
	infos := s.mem.Engines(nil)
	// A stored response's GET or cancel goes to the engine holding it (its
	// id names the engine: docs/REQUESTS.md), then by load.
	owner := ""
	if x.kind == pathResponseByID {
		for i := range infos {
			if ingress.ResponseOwner(x.ep, infos[i].ID) {
				owner = infos[i].ID
				break
			}
		}
		if owner == "" { // an id no kvmesh ingress made, or whose engine is gone: the ingress's 404
			id, _, _ := strings.Cut(strings.TrimPrefix(x.ep, "/v1/responses/"), "/")
			x.s.m.results.WithLabelValues("not_found").Inc()
			status, body := ingress.ResponseNotFound(id)
			return x.reject(status, body, 0, "kvmesh_epp_response_not_found")
		}
	}
	slices.SortStableFunc(infos, func(a, b ingress.EngineInfo) int {
		if oa, ob := a.ID == owner, b.ID == owner; owner != "" && oa != ob {
			if oa {
				return -1
			}
			return 1
		}
		return (a.InFlight + a.Waiting) - (b.InFlight + b.Waiting)
	})
	for _, e := range infos {
		if len(x.dests) >= s.cfg.MaxEndpoints {
			break
		}
		ep, ok := s.eps.of(e.URL)
		if !ok || !e.Healthy || (x.hasSubset && !contains(x.subset, ep)) || contains(x.dests, ep) {
			continue
		}
		if s.pd != nil && e.Role == scheduler.RolePrefill {
			continue // with P/D, prefill engines serve prefill legs only (as routed requests)
		}
		x.dests = append(x.dests, ep)
		x.engines = append(x.engines, e.ID)
	}
	if len(x.dests) == 0 {
		return x.noEndpoint("")
	}
	x.answered = true
	answer(joinEndpoints(x.dests), "")
	s.m.results.WithLabelValues("bodyless").Inc()
	return false
}

// refusedMethod answers, as the ingress does before it authenticates, a
// method the endpoint does not take with 405 and Allow: an inference or
// passthrough endpoint takes POST, the model list GET and HEAD (other
// paths go to the engines as they come). A browser's CORS preflight
// (OPTIONS) is one: like the ingress without --cors-origins, the picker
// answers no preflight (the gateway's CORS filter does), and a preflight
// carries no credential to be refused with 401. True: answered.
func (x *exchange) refusedMethod() bool {
	var allow string
	var takes bool
	switch x.kind {
	case pathInference, pathPassthrough:
		allow, takes = "POST", x.method == "POST"
	case pathModels:
		allow, takes = "GET, HEAD", x.method == "GET" || x.method == "HEAD"
	default:
		return false
	}
	if takes || x.method == "" { // "": no :method (not Envoy)
		return false
	}
	status, body := ingress.MethodNotAllowed(x.method, x.path, allow)
	x.s.m.results.WithLabelValues("rejected").Inc()
	x.s.m.immediate.WithLabelValues(strconv.Itoa(status)).Inc()
	r := immediate(status, body, 0, "kvmesh_epp_method_not_allowed")
	hm := r.GetImmediateResponse().Headers
	hm.SetHeaders = append(hm.SetHeaders, setHeader("allow", allow))
	x.out = append(x.out, r)
	return true
}

// answerModels answers /v1/models and /v1/models/{id} itself, as the
// ingress does, with every model the pool's live engines serve: one
// engine's list would depend on the pick, and a card of a model it does
// not serve would be its 404. The credential passed at the headers.
func (x *exchange) answerModels() bool {
	status, body, allow := x.s.ing.Models(x.method, x.ep)
	x.s.m.results.WithLabelValues("models").Inc()
	x.s.m.immediate.WithLabelValues(strconv.Itoa(status)).Inc()
	r := immediate(status, body, 0, "kvmesh_epp_models")
	if allow != "" {
		hm := r.GetImmediateResponse().Headers
		hm.SetHeaders = append(hm.SetHeaders, setHeader("allow", allow))
	}
	x.out = append(x.out, r)
	return true
}

// noEndpoint is the protocol's 503: nothing eligible (the subset hint
// excludes every ranked engine, or the pool has none). why is the
// ingress's reason when it found no engine at all ("": none given).
func (x *exchange) noEndpoint(why string) bool {
	x.s.m.results.WithLabelValues("no_endpoint").Inc()
	msg := "no endpoint fits: no ranked engine is a ready endpoint of the pool (within the gateway's subset hint)"
	if why != "" {
		msg = "no endpoint fits: no engine of the mesh that is a ready endpoint of the pool can take the request (" + why + ")"
	}
	return x.reject(503, openai.AppendError(nil, msg, "server_error", "", "service_unavailable"), 1, "kvmesh_epp_no_endpoint")
}

// tooLarge is the 413 past Config.MaxBodyBytes (after decoding: how the
// body came encoded).
func (x *exchange) tooLarge(decoded string) bool {
	x.s.m.results.WithLabelValues("too_large").Inc()
	msg := "request body too large: limit is " + strconv.Itoa(x.s.cfg.MaxBodyBytes) + " bytes"
	if decoded != "" {
		msg += " after decoding its content-encoding " + decoded
	}
	return x.reject(413, openai.AppendError(nil, msg, "invalid_request_error", "", "request_too_large"), 0, "kvmesh_epp_body_too_large")
}

// truncated is the 413 for a BUFFERED_PARTIAL body cut at the data plane's
// buffer: the rest never reaches the picker.
func (x *exchange) truncated() bool {
	x.s.m.results.WithLabelValues("too_large").Inc()
	return x.reject(413, openai.AppendError(nil, "request body larger than the gateway's ext_proc buffer (BUFFERED_PARTIAL sent only its first part)", "invalid_request_error", "", "request_too_large"), 0, "kvmesh_epp_body_truncated")
}

// reject answers with an ImmediateResponse and ends the stream.
func (x *exchange) reject(status int, body []byte, retryAfter int, details string) bool {
	x.s.m.immediate.WithLabelValues(strconv.Itoa(status)).Inc()
	x.finishPicked(status)
	x.out = append(x.out, immediate(status, body, retryAfter, details))
	return true
}

func (x *exchange) responseHeaders(req *extprocv3.ProcessingRequest, h *extprocv3.HttpHeaders) {
	for _, hv := range h.GetHeaders().GetHeaders() {
		if hv.GetKey() == ":status" {
			x.status, _ = strconv.Atoi(headerValue(hv))
			break
		}
	}
	x.served(req)
	if x.picked != nil {
		x.picked.FirstByte()
	}
	x.out = append(x.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
		ResponseHeaders: &extprocv3.HeadersResponse{}}})
	if h.GetEndOfStream() {
		x.end()
	}
}

// served moves the request's charge when the data plane fell back to
// another endpoint of the list.
func (x *exchange) served(req *extprocv3.ProcessingRequest) {
	eps, ok, bad := metadataEndpoints(req.GetMetadataContext(), LBNamespace, ServedKey)
	if bad > 0 {
		x.s.m.badMetadata.WithLabelValues(ServedKey).Add(float64(bad))
	}
	if !ok || len(eps) == 0 || x.picked == nil || len(x.dests) == 0 || eps[0] == x.dests[0] {
		return
	}
	for i, ep := range x.dests {
		if ep == eps[0] {
			if x.picked.Start(x.engines[i]) == nil {
				x.s.m.fellBack.Inc()
			}
			return
		}
	}
	x.s.m.badMetadata.WithLabelValues(ServedKey).Inc() // served an endpoint we did not offer
}

func (x *exchange) responseBody(b *extprocv3.HttpBody) {
	if x.picked != nil {
		// Its usage, read as the chunks pass: the output tokens the
		// request's token budgets settle on (Picked.Done).
		x.ans.add(b.GetBody(), x.picked.Answer)
	}
	common := &extprocv3.CommonResponse{}
	if x.respMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED {
		common = streamedBody(b.GetBody(), b.GetEndOfStream())
	}
	x.out = append(x.out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{
		ResponseBody: &extprocv3.BodyResponse{Response: common}}})
	if b.GetEndOfStream() {
		x.end()
	}
}

// end releases the decision with the response status (0: none came),
// after reading the rest of the answer.
func (x *exchange) end() {
	if x.picked != nil {
		x.ans.end(x.picked.Answer)
	}
	x.finishPicked(x.status)
}

func (x *exchange) finishPicked(status int) {
	if x.picked != nil {
		x.picked.Done(status)
		x.picked = nil
	}
}

// fillDests turns the ranking into the fallback list: endpoints known,
// inside the subset hint when one was given, decode-capable when P/D is
// on, at most Config.MaxEndpoints. It returns the prefiller endpoint ("" for none).
func (x *exchange) fillDests(p *ingress.Picked) string {
	s := x.s
	for _, r := range p.Ranked() {
		if len(x.dests) >= s.cfg.MaxEndpoints {
			break
		}
		url, role, ok := p.Candidate(r.Engine)
		if !ok {
			continue
		}
		ep, ok := s.eps.of(url)
		// Two engines of the mesh at one endpoint (a sidecar restarted
		// under a new id, a pod IP reused while the old member lingers in
		// gossip): listed once, so no fallback slot goes to a retry of it.
		if !ok || (x.hasSubset && !contains(x.subset, ep)) || contains(x.dests, ep) {
			continue
		}
		if s.pd != nil && role == scheduler.RolePrefill {
			continue
		}
		x.dests = append(x.dests, ep)
		x.engines = append(x.engines, r.Engine)
	}
	if s.pd == nil || len(x.engines) == 0 || x.kind != pathInference {
		return "" // P/D is for generation: an embeddings request runs whole
	}
	id, ok := s.pd.Prefill(p, x.engines[0])
	if !ok {
		return ""
	}
	url, _, ok := p.Candidate(id)
	if !ok {
		return ""
	}
	ep, _ := s.eps.of(url)
	return ep
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func joinEndpoints(eps []string) string {
	n := len(eps) - 1
	for _, e := range eps {
		n += len(e)
	}
	b := make([]byte, 0, n)
	for i, e := range eps {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, e...)
	}
	return string(b)
}
