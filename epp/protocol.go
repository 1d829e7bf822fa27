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

// isInferencePath reports which OpenAI route a :path names (query dropped).
func isInferencePath(path string) (in ingress.PickInput, ok bool) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case "/v1/chat/completions":
		return ingress.PickInput{Chat: true}, true
	case "/v1/completions":
		return ingress.PickInput{}, true
	case "/v1/responses":
		return ingress.PickInput{Responses: true}, true
	case "/v1/messages":
		return ingress.PickInput{Messages: true}, true
	}
	return in, false
}
