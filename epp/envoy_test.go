package epp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"
)

// envoyStandIn is a STAND-IN for Envoy's ext_proc HTTP filter, which cannot
// run here. It opens one Process stream per HTTP request (as Envoy does, on
// one long-lived HTTP/2 connection), sends protocol_config on the stream's
// first message (Envoy ≥ 1.35) and plays the message order Envoy uses for
// the configured body modes:
//
//   - FULL_DUPLEX_STREAMED: headers and every body chunk (or trailers) go
//     out without waiting; the answers come after (headers, body, trailers).
//   - BUFFERED: headers, wait for their answer; the whole body in one
//     message, wait for its answer (which carries the routing).
//   - STREAMED + send_body_without_waiting_for_header_response: like full
//     duplex, with one answer per body chunk.
//
// It then forwards the request to the first endpoint of the picker's list
// (real HTTP to the simulated engine) and feeds the engine's real response
// through the response phase with the served endpoint in envoy.lb metadata.
type envoyStandIn struct {
	conn     *grpc.ClientConn
	client   extprocv3.ExternalProcessorClient
	reqMode  extprocfilter.ProcessingMode_BodySendMode
	respMode extprocfilter.ProcessingMode_BodySendMode
	noWait   bool
	chunk    int  // request body chunk size
	noConfig bool // an older Envoy: no protocol_config
}

func newEnvoy(t testing.TB, addr string, reqMode, respMode extprocfilter.ProcessingMode_BodySendMode) *envoyStandIn {
	t.Helper()
	// Envoy's gRPC client takes answers of any size by default (EnvoyGrpc's
	// max_receive_message_length 0); grpc-go's stops at 4 MiB.
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(64<<20)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &envoyStandIn{conn: conn, client: extprocv3.NewExternalProcessorClient(conn), reqMode: reqMode, respMode: respMode,
		noWait: reqMode == extprocfilter.ProcessingMode_STREAMED, chunk: 97}
}

// standInIDs numbers the stand-in's x-request-id values.
var standInIDs atomic.Int64

// errImmediate: the picker answered with an ImmediateResponse (in res.immediate).
var errImmediate = errors.New("immediate response")

// httpRequest is one client request as it reaches the gateway.
type httpRequest struct {
	method, path string
	headers      [][2]string
	body         []byte
	trailers     bool     // the body ends with trailers, not an end_of_stream chunk
	subset       []string // the subset hint; nil: none
	subsetSet    bool     // send the subset key even when the list is empty
}

// exchangeResult is what the stand-in saw on one stream.
type exchangeResult struct {
	reqHeaders  *extprocv3.ProcessingResponse // answer to the request headers
	reqBodies   []*extprocv3.ProcessingResponse
	reqTrailers *extprocv3.ProcessingResponse
	immediate   *extprocv3.ImmediateResponse
	dest        string // header mutation value
	metaDest    string // envoy.lb dynamic metadata value
	prefiller   string
	removed     []string
	clearRoute  bool
	forwarded   []byte // the body the data plane would send upstream

	served     string // endpoint the stand-in used
	status     int
	respBody   []byte // the engine's body as the client gets it
	respAnswer []*extprocv3.ProcessingResponse
}

func (e *envoyStandIn) headerMap(kv [][2]string) *corev3.HeaderMap {
	hm := &corev3.HeaderMap{}
	for _, h := range kv {
		hm.Headers = append(hm.Headers, &corev3.HeaderValue{Key: h[0], RawValue: []byte(h[1])})
	}
	return hm
}

func (e *envoyStandIn) first(msg *extprocv3.ProcessingRequest) {
	if !e.noConfig {
		msg.ProtocolConfig = &extprocv3.ProtocolConfiguration{RequestBodyMode: e.reqMode, ResponseBodyMode: e.respMode,
			SendBodyWithoutWaitingForHeaderResponse: e.noWait}
	}
}

func subsetMetadata(r *httpRequest) *corev3.Metadata {
	if r.subset == nil && !r.subsetSet {
		return nil
	}
	vals := make([]any, len(r.subset))
	for i, s := range r.subset {
		vals[i] = s
	}
	inner, err := structpb.NewStruct(map[string]any{SubsetKey: vals})
	if err != nil {
		panic(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: inner}}
}

// do runs one HTTP request through the picker and, when routed, through the
// engine at the first endpoint; upstream nil skips the engine (the response
// is a bare 200 with a small JSON body).
func (e *envoyStandIn) do(ctx context.Context, r httpRequest, upstream bool) (*exchangeResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	st, err := e.client.Process(ctx)
	if err != nil {
		return nil, err
	}
	res := &exchangeResult{}
	// Envoy's HTTP connection manager gives every request an x-request-id
	// (generate_request_id, on by default).
	hdrs := append([][2]string{{":method", r.method}, {":path", r.path}, {":authority", "gateway.example"}, {":scheme", "http"},
		{"content-type", "application/json"}, {"x-request-id", fmt.Sprintf("standin-%d", standInIDs.Add(1))}}, r.headers...)
	if len(r.body) > 0 {
		hdrs = append(hdrs, [2]string{"content-length", strconv.Itoa(len(r.body))})
	}
	hmsg := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: e.headerMap(hdrs), EndOfStream: len(r.body) == 0}}, MetadataContext: subsetMetadata(&r)}
	e.first(hmsg)
	if err := st.Send(hmsg); err != nil {
		return nil, err
	}
	bodyless := len(r.body) == 0 || e.reqMode == extprocfilter.ProcessingMode_NONE
	var chunks [][]byte
	if !bodyless {
		switch e.reqMode {
		case extprocfilter.ProcessingMode_BUFFERED, extprocfilter.ProcessingMode_BUFFERED_PARTIAL:
			chunks = [][]byte{r.body}
		default:
			for b := r.body; len(b) > 0; {
				n := min(e.chunk, len(b))
				chunks = append(chunks, b[:n])
				b = b[n:]
			}
		}
	}
	recv := func() (*extprocv3.ProcessingResponse, error) {
		m, err := st.Recv()
		if err != nil {
			return nil, fmt.Errorf("recv: %w", err)
		}
		if ir := m.GetImmediateResponse(); ir != nil {
			res.immediate = ir
			return m, errImmediate
		}
		return m, nil
	}
	if bodyless {
		m, err := recv()
		if err != nil {
			return res, err
		}
		res.reqHeaders = m
	} else {
		buffered := e.reqMode == extprocfilter.ProcessingMode_BUFFERED || e.reqMode == extprocfilter.ProcessingMode_BUFFERED_PARTIAL
		if buffered {
			// Envoy holds the body until the headers are answered.
			m, err := recv()
			if err != nil {
				return res, err
			}
			res.reqHeaders = m
		}
		for i, c := range chunks {
			eos := i == len(chunks)-1 && !r.trailers
			if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
				RequestBody: &extprocv3.HttpBody{Body: c, EndOfStream: eos}}}); err != nil {
				return nil, err
			}
			if buffered {
				m, err := recv()
				if err != nil {
					return res, err
				}
				res.reqBodies = append(res.reqBodies, m)
			}
		}
		if r.trailers {
			if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestTrailers{
				RequestTrailers: &extprocv3.HttpTrailers{Trailers: e.headerMap([][2]string{{"x-trailer", "1"}})}}}); err != nil {
				return nil, err
			}
		}
		if !buffered {
			m, err := recv()
			if err != nil {
				return res, err
			}
			res.reqHeaders = m
			n := 1
			if e.reqMode == extprocfilter.ProcessingMode_STREAMED {
				n = len(chunks)
			}
			for range n {
				m, err := recv()
				if err != nil {
					return res, err
				}
				res.reqBodies = append(res.reqBodies, m)
			}
		}
		if r.trailers {
			m, err := recv()
			if err != nil {
				return res, err
			}
			res.reqTrailers = m
		}
	}
	if err := res.readRouting(e, r.body); err != nil {
		return res, err
	}
	if err := e.respond(st, res, r, upstream); err != nil {
		return res, err
	}
	if err := st.CloseSend(); err != nil {
		return res, err
	}
	if _, err := st.Recv(); !errors.Is(err, io.EOF) {
		return res, fmt.Errorf("stream did not end after the response: %v", err)
	}
	return res, nil
}

// readRouting applies the answers as Envoy would: the header mutation and
// metadata from whichever answer carried them, the body from the body answers.
func (res *exchangeResult) readRouting(e *envoyStandIn, orig []byte) error {
	route := res.reqHeaders
	var common *extprocv3.CommonResponse
	if rh := route.GetRequestHeaders(); rh != nil {
		common = rh.GetResponse()
	}
	if common.GetHeaderMutation() == nil && len(res.reqBodies) > 0 {
		route = res.reqBodies[0]
		common = route.GetRequestBody().GetResponse()
	}
	for _, h := range common.GetHeaderMutation().GetSetHeaders() {
		switch h.GetHeader().GetKey() {
		case DestinationKey:
			res.dest = string(h.GetHeader().GetRawValue())
		case PrefillerHeader:
			res.prefiller = string(h.GetHeader().GetRawValue())
		}
	}
	res.removed = common.GetHeaderMutation().GetRemoveHeaders()
	res.clearRoute = common.GetClearRouteCache()
	if v := route.GetDynamicMetadata().GetFields()[LBNamespace].GetStructValue().GetFields()[DestinationKey]; v != nil {
		res.metaDest = v.GetStringValue()
	}
	res.forwarded = orig
	if b := common.GetBodyMutation().GetBody(); b != nil { // BUFFERED: the body replaced
		res.forwarded = b
	}
	switch e.reqMode {
	case extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED:
		res.forwarded = nil
		for _, b := range res.reqBodies {
			res.forwarded = append(res.forwarded, b.GetRequestBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		}
	case extprocfilter.ProcessingMode_STREAMED:
		// Each chunk as its answer leaves it: replaced, cleared or passed.
		res.forwarded = nil
		for i, b := range res.reqBodies {
			chunk := orig[min(i*e.chunk, len(orig)):min((i+1)*e.chunk, len(orig))]
			switch m := b.GetRequestBody().GetResponse().GetBodyMutation(); {
			case m.GetBody() != nil:
				chunk = m.GetBody()
			case m.GetClearBody():
				chunk = nil
			}
			res.forwarded = append(res.forwarded, chunk...)
		}
	}
	if res.dest == "" {
		return errors.New("no destination in the answers")
	}
	return nil
}

// respond sends the request to the first endpoint (or fakes a bare 200) and
// plays the response phase.
func (e *envoyStandIn) respond(st extprocv3.ExternalProcessor_ProcessClient, res *exchangeResult, r httpRequest, upstream bool) error {
	res.served, _, _ = strings.Cut(res.dest, ",")
	res.status = 200
	ctype := "application/json"
	var body [][]byte
	if upstream {
		req, err := http.NewRequest(r.method, "http://"+res.served+r.path, bytes.NewReader(res.forwarded))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		res.status, ctype = resp.StatusCode, resp.Header.Get("Content-Type")
		buf := make([]byte, 512)
		for {
			n, err := resp.Body.Read(buf)
			if n > 0 {
				body = append(body, append([]byte(nil), buf[:n]...))
			}
			if err == io.EOF {
				break
			}
			if err != nil {
				return err
			}
		}
	} else {
		body = [][]byte{[]byte(`{"ok":true}`)}
	}
	served, err := structpb.NewStruct(map[string]any{ServedKey: res.served})
	if err != nil {
		return err
	}
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{LBNamespace: served}}
	noBody := e.respMode == extprocfilter.ProcessingMode_NONE || len(body) == 0
	if err := st.Send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: e.headerMap([][2]string{{":status", strconv.Itoa(res.status)}, {"content-type", ctype}}),
			EndOfStream: noBody}}}); err != nil {
		return err
	}
	m, err := st.Recv()
	if err != nil {
		return err
	}
	res.respAnswer = append(res.respAnswer, m)
	if noBody {
		for _, b := range body {
			res.respBody = append(res.respBody, b...)
		}
		return nil
	}
	for i, b := range body {
		if err := st.Send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseBody{
			ResponseBody: &extprocv3.HttpBody{Body: b, EndOfStream: i == len(body)-1}}}); err != nil {
			return err
		}
		if e.respMode == extprocfilter.ProcessingMode_BUFFERED {
			continue // one answer for the whole body, below
		}
		m, err := st.Recv()
		if err != nil {
			return err
		}
		res.respAnswer = append(res.respAnswer, m)
		if e.respMode == extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED {
			res.respBody = append(res.respBody, m.GetResponseBody().GetResponse().GetBodyMutation().GetStreamedResponse().GetBody()...)
		} else {
			res.respBody = append(res.respBody, b...)
		}
	}
	if e.respMode == extprocfilter.ProcessingMode_BUFFERED {
		return errors.New("stand-in: buffered response bodies are not played")
	}
	return nil
}

func servedMetadata(t testing.TB, served string) *corev3.Metadata {
	s, err := structpb.NewStruct(map[string]any{ServedKey: served})
	if err != nil {
		t.Fatal(err)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{LBNamespace: s}}
}
