package epp

import (
	"strconv"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvmesh/kvmesh/ingress"
)

// Reading and writing the Endpoint Picker Protocol's fields on ext_proc
// messages. Header keys arrive lower-cased; values in raw_value (Envoy) or
// value (older data planes).

func headerValue(h *corev3.HeaderValue) string {
	if len(h.GetRawValue()) > 0 {
		return string(h.GetRawValue())
	}
	return h.GetValue()
}

// metadataEndpoints reads an endpoint list from filter metadata
// namespace/key: a list of "ip:port" strings or one comma-separated string
// (both forms are in use). present is false when the key is absent.
func metadataEndpoints(md *corev3.Metadata, namespace, key string) (eps []string, present bool, bad int) {
	ns := md.GetFilterMetadata()[namespace]
	if ns == nil {
		return nil, false, 0
	}
	v, ok := ns.GetFields()[key]
	if !ok {
		return nil, false, 0
	}
	switch k := v.GetKind().(type) {
	case *structpb.Value_StringValue:
		eps, bad = parseEndpointList(nil, k.StringValue)
	case *structpb.Value_ListValue:
		for _, item := range k.ListValue.GetValues() {
			s, ok := item.GetKind().(*structpb.Value_StringValue)
			if !ok {
				bad++
				continue
			}
			var n int
			eps, n = parseEndpointList(eps, s.StringValue)
			bad += n
		}
	default:
		bad++
	}
	return eps, true, bad
}

// setHeader is an overwrite: a client cannot smuggle its own destination or
// prefiller past the picker.
func setHeader(key, value string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: key, RawValue: []byte(value)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}

// routeMutation sets the destination (and prefiller) headers; without a
// prefiller it removes any the client sent.
func routeMutation(dest, prefiller string) *extprocv3.HeaderMutation {
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader(DestinationKey, dest)}}
	if prefiller != "" {
		hm.SetHeaders = append(hm.SetHeaders, setHeader(PrefillerHeader, prefiller))
	} else {
		hm.RemoveHeaders = []string{PrefillerHeader}
	}
	return hm
}

// destinationMetadata is {"envoy.lb": {"x-gateway-destination-endpoint": dest}},
// the same value as the header (the protocol forbids them differing).
func destinationMetadata(dest string) *structpb.Struct {
	return &structpb.Struct{Fields: map[string]*structpb.Value{
		LBNamespace: structpb.NewStructValue(&structpb.Struct{Fields: map[string]*structpb.Value{
			DestinationKey: structpb.NewStringValue(dest),
		}}),
	}}
}

func routeCommon(dest, prefiller string) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{HeaderMutation: routeMutation(dest, prefiller), ClearRouteCache: true}
}

func headersResponse(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestHeaders{
		RequestHeaders: &extprocv3.HeadersResponse{Response: common}}}
}

func bodyResponse(common *extprocv3.CommonResponse) *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{
		RequestBody: &extprocv3.BodyResponse{Response: common}}}
}

// streamedBody passes a body chunk on in FULL_DUPLEX_STREAMED mode (the
// data plane forwards only what the processor sends back).
func streamedBody(body []byte, eos bool) *extprocv3.CommonResponse {
	return &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{Mutation: &extprocv3.BodyMutation_StreamedResponse{
		StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}}
}

func trailersResponse() *extprocv3.ProcessingResponse {
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{
		RequestTrailers: &extprocv3.TrailersResponse{}}}
}

// immediate is a local reply: the status, the OpenAI error body as JSON and
// Retry-After when given.
func immediate(status int, body []byte, retryAfter int, details string) *extprocv3.ProcessingResponse {
	hm := &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{setHeader("content-type", "application/json")}}
	if retryAfter > 0 {
		hm.SetHeaders = append(hm.SetHeaders, setHeader("retry-after", strconv.Itoa(retryAfter)))
	}
	return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: &extprocv3.ImmediateResponse{
			Status:  &typev3.HttpStatus{Code: typev3.StatusCode(status)},
			Headers: hm,
			Body:    body,
			Details: details,
		}}}
}

// pathKind is what the picker makes of a request's :path.
type pathKind uint8

const (
	// pathOther: any other path. A request with a body is routed as the
	// ingress routes the engine's other endpoints (passthrough): the body's
	// model selects the engines, by load; one without a body goes by load.
	pathOther        pathKind = iota
	pathInference             // chat, completions, responses, messages: the ingress's decision
	pathPassthrough           // embeddings, rerank, score, tokenize…: by load among the model's engines
	pathResponseByID          // GET or cancel of a stored response: the engine holding it
	pathModels                // /v1/models and /v1/models/{id}: answered by the picker (answerModels)
)

// inferenceEndpoints are the routes the ingress decides on the prompt.
var inferenceEndpoints = [...]struct {
	path string
	in   ingress.PickInput
}{
	{"/v1/chat/completions", ingress.PickInput{Chat: true}},
	{"/v1/completions", ingress.PickInput{}},
	{"/v1/responses", ingress.PickInput{Responses: true}},
	{"/v1/messages", ingress.PickInput{Messages: true}},
}

// passthroughEndpoints are the engine's other JSON endpoints the ingress
// serves (ingress/passthrough.go), longer names first where one ends
// another.
var passthroughEndpoints = [...]string{"/v1/embeddings", "/pooling", "/classify", "/v1/score", "/score",
	"/v1/rerank", "/v2/rerank", "/rerank", "/tokenize", "/detokenize", "/v1/messages/count_tokens"}

// classifyPath reads a :path the way docs/GATEWAY.md ("Paths") describes:
// the query and one trailing slash are dropped, and an endpoint is
// recognised by the path's ending, so a gateway that publishes
// /llama3/v1/chat/completions and rewrites it upstream (Envoy rewrites
// after ext_proc: the picker sees the client's path) gets the same decision
// as /v1/chat/completions. ep is the endpoint's own path (for pathOther,
// the path without its query); in names the endpoint for Pick.
func classifyPath(path string) (kind pathKind, ep string, in ingress.PickInput) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	if len(path) > 1 && path[len(path)-1] == '/' {
		path = path[:len(path)-1]
	}
	for _, e := range inferenceEndpoints {
		if strings.HasSuffix(path, e.path) {
			return pathInference, e.path, e.in
		}
	}
	for _, e := range passthroughEndpoints {
		if strings.HasSuffix(path, e) {
			return pathPassthrough, e, ingress.PickInput{Other: true}
		}
	}
	if i := strings.LastIndex(path, "/v1/responses/"); i >= 0 {
		return pathResponseByID, path[i:], in
	}
	if strings.HasSuffix(path, "/v1/models") {
		return pathModels, "/v1/models", in
	}
	if i := strings.LastIndex(path, "/v1/models/"); i >= 0 {
		return pathModels, path[i:], in
	}
	return pathOther, path, ingress.PickInput{Other: true}
}
