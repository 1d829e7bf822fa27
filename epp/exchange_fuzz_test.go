package epp

import (
	"bytes"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvmesh/kvmesh/ingress"
)

// fuzzBodyLimit is the picker's --max-body in FuzzExchange: small, so
// fuzzed bodies reach it.
const fuzzBodyLimit = 2048

// FuzzExchange feeds the ext_proc state machine a sequence of messages
// built from fuzz bytes (any body mode, any order: headers, body chunks,
// trailers, the response side), as Envoy or a misbehaving data plane could
// send them. It must never panic, and:
//   - the body held never passes --max-body, and what it charges to the
//     ingress's body budget is exactly what it holds, all of it given back
//     at the stream's end;
//   - a message that ends the stream is answered with an ImmediateResponse
//     (an error status), and only such a message is;
//   - a routing answer names only endpoints of the pool, at most
//     MaxEndpoints, the same in the header and the metadata;
//   - each response-side message gets its one answer of its own phase.
func FuzzExchange(f *testing.F) {
	chat := []byte(`{"model":"llama","messages":[{"role":"user","content":"hello there"}],"max_tokens":8,"stream":true}`)
	comp := []byte(`{"model":"llama","prompt":"Once upon a time","max_tokens":16}`)
	// Script bytes: see msgs below. Full duplex: headers, body eos, response headers 200, response body eos.
	f.Add([]byte{0, 0x00, 1, 0xff, 3, 0, 4, 1}, chat, uint8(4))
	f.Add([]byte{0, 0x01, 1, 0x40, 1, 0xff, 2, 3, 0x40, 5}, comp, uint8(4))
	// BUFFERED: headers, whole body.
	f.Add([]byte{0, 0x00, 1, 0xff, 3, 1, 4, 1}, chat, uint8(2))
	// BUFFERED_PARTIAL without end of stream, with a content-length.
	f.Add([]byte{0, 0x09, 0, 1, 0x7e, 2}, comp, uint8(3))
	// STREAMED with and without waiting; GRPC; NONE.
	f.Add([]byte{0, 0x01, 1, 0x20, 0, 1, 0xff}, comp, uint8(1))
	f.Add([]byte{0, 0x01, 1, 0xff}, comp, uint8(1|0x80))
	f.Add([]byte{0, 0x01, 1, 0xff}, comp, uint8(5))
	f.Add([]byte{0, 0x02, 3, 2, 5}, []byte{}, uint8(0))
	// A bodyless GET, a gzip body that is not gzip, an oversize content-length.
	f.Add([]byte{0, 0x23, 3, 0}, []byte{}, uint8(4))
	f.Add([]byte{0, 0x11, 1, 0xff}, comp, uint8(4))
	f.Add([]byte{0, 0x01, 1, 0xff}, bytes.Repeat([]byte("a"), 3000), uint8(4))
	// Response side before any request, strays after the answer.
	f.Add([]byte{3, 7, 4, 0, 5, 1, 0xff, 2}, comp, uint8(4))
	f.Add([]byte{0, 0x01, 1, 0xff, 1, 0xff, 2, 0, 0x01}, comp, uint8(2))

	ic := ingress.DefaultConfig()
	ic.Listen = "127.0.0.1:0"
	ic.AccessLog = false
	for _, e := range twoEngines {
		ic.Engines = append(ic.Engines, ingress.StaticEngine{ID: e[0], Model: model, URL: e[1]})
	}
	reg := prometheus.NewRegistry()
	ing, err := ingress.New(ic, ingress.Deps{Logger: quiet, AccessLog: quiet, Registry: reg})
	if err != nil {
		f.Fatal(err)
	}
	s, err := New(Config{Listen: "127.0.0.1:0", TLS: TLSOff, Logger: quiet, Registerer: reg, MaxBodyBytes: fuzzBodyLimit}, Deps{Ingress: ing})
	if err != nil {
		f.Fatal(err)
	}
	inFlight := func() float64 {
		mfs, err := reg.Gather()
		if err != nil {
			f.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvmesh_ingress_body_bytes_in_flight" {
				return mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		return 0
	}
	pool := map[string]bool{"10.0.0.1:8000": true, "10.0.0.2:8000": true}
	modes := []extprocfilter.ProcessingMode_BodySendMode{
		extprocfilter.ProcessingMode_NONE, extprocfilter.ProcessingMode_STREAMED, extprocfilter.ProcessingMode_BUFFERED,
		extprocfilter.ProcessingMode_BUFFERED_PARTIAL, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_GRPC,
	}
	paths := []string{"/v1/chat/completions", "/v1/completions", "/v1/responses", "/v1/models", "/v1/responses/resp_e1-abc", "/v1/messages?beta=true", "/v1/embeddings", ""}
	encodings := []string{"", "gzip", "identity", "br", "x-unknown", "zstd", "deflate", "GZIP"}
	statuses := []string{"200", "429", "500", "abc", "", "-1", "99999999999999999999", "200 "}

	f.Fuzz(func(t *testing.T, script, body []byte, mode uint8) {
		x := s.xs.Get().(*exchange)
		x.reset()
		if inFlight() != 0 {
			t.Fatalf("body budget in use before the stream: %v", inFlight())
		}
		next := func() byte {
			if len(script) == 0 {
				return 0
			}
			b := script[0]
			script = script[1:]
			return b
		}
		first := true
		for n := 0; len(script) > 0 && n < 64; n++ {
			op := next()
			req := &extprocv3.ProcessingRequest{}
			if first {
				first = false
				if mode&0x40 == 0 {
					req.ProtocolConfig = &extprocv3.ProtocolConfiguration{
						RequestBodyMode:                         modes[int(mode&0x3f)%len(modes)],
						ResponseBodyMode:                        modes[int(mode>>3)%len(modes)],
						SendBodyWithoutWaitingForHeaderResponse: mode&0x80 == 0,
					}
				}
			}
			respSide := false
			switch op % 6 {
			case 0: // request headers: path, encoding, content-length, eos, subset
				a := next()
				kv := []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte(paths[int(a&0x07)%len(paths)])},
					{Key: "content-type", RawValue: []byte("application/json")}, {Key: "authorization", RawValue: []byte("Bearer k")}}
				if e := encodings[int(a>>4)%len(encodings)]; e != "" {
					kv = append(kv, &corev3.HeaderValue{Key: "content-encoding", RawValue: []byte(e)})
				}
				if a&0x08 != 0 {
					cl := []string{"64", "0", "-3", "99999", "abc", "2048", "2049", "1"}[int(next())%8]
					kv = append(kv, &corev3.HeaderValue{Key: "content-length", RawValue: []byte(cl)})
				}
				h := &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: kv}, EndOfStream: a&0x07 == 3 || a&0x07 == 7}
				req.Request = &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: h}
				if a&0x80 != 0 {
					req.MetadataContext = subsetMD(next())
				}
			case 1: // a request body chunk: length byte (0xff: the rest), eos bit in the next
				l := int(next())
				if l == 0xff || l > len(body) {
					l = len(body)
				}
				chunk := body[:l]
				body = body[l:]
				req.Request = &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: chunk, EndOfStream: len(body) == 0 || next()&1 == 1}}
			case 2:
				req.Request = &extprocv3.ProcessingRequest_RequestTrailers{RequestTrailers: &extprocv3.HttpTrailers{}}
			case 3: // response headers: status, served endpoint
				a := next()
				kv := []*corev3.HeaderValue{{Key: ":status", RawValue: []byte(statuses[int(a)%len(statuses)])}}
				req.Request = &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: kv}, EndOfStream: a&0x80 != 0}}
				if a&0x40 != 0 {
					req.MetadataContext = servedMD([]string{"10.0.0.2:8000", "10.0.0.9:1", "", "not an endpoint"}[int(a>>3)%4])
				}
				respSide = true
			case 4:
				req.Request = &extprocv3.ProcessingRequest_ResponseBody{ResponseBody: &extprocv3.HttpBody{Body: []byte("data: {}\n\n"), EndOfStream: next()&1 == 1}}
				respSide = true
			case 5:
				req.Request = &extprocv3.ProcessingRequest_ResponseTrailers{ResponseTrailers: &extprocv3.HttpTrailers{}}
				respSide = true
			}
			x.out = x.out[:0]
			wasAnswered := x.answered
			done := x.handle(req)
			if len(x.body) > fuzzBodyLimit {
				t.Fatalf("holds %d body bytes, over --max-body %d", len(x.body), fuzzBodyLimit)
			}
			if x.held < 0 || float64(x.held) != inFlight() {
				t.Fatalf("charged %d, the budget shows %v", x.held, inFlight())
			}
			imm := 0
			for _, r := range x.out {
				if ir := r.GetImmediateResponse(); ir != nil {
					imm++
					if c := ir.GetStatus().GetCode(); c < 400 || c > 599 {
						t.Fatalf("immediate response with status %d", c)
					}
				}
			}
			if done != (imm > 0) {
				t.Fatalf("handle ended the stream %v with %d immediate responses: %v", done, imm, x.out)
			}
			if done && x.out[len(x.out)-1].GetImmediateResponse() == nil {
				t.Fatal("the stream's last answer is no ImmediateResponse")
			}
			if respSide {
				if len(x.out) != 1 {
					t.Fatalf("%d answers to a response-side message", len(x.out))
				}
				ok := false
				switch req.Request.(type) {
				case *extprocv3.ProcessingRequest_ResponseHeaders:
					ok = x.out[0].GetResponseHeaders() != nil
				case *extprocv3.ProcessingRequest_ResponseBody:
					ok = x.out[0].GetResponseBody() != nil
				case *extprocv3.ProcessingRequest_ResponseTrailers:
					ok = x.out[0].GetResponseTrailers() != nil
				}
				if !ok {
					t.Fatalf("answered %v with %v", req.Request, x.out[0])
				}
			}
			if !wasAnswered && x.answered {
				if len(x.dests) == 0 || len(x.dests) > s.cfg.MaxEndpoints || len(x.dests) != len(x.engines) {
					t.Fatalf("routed to %v (%v)", x.dests, x.engines)
				}
				for _, d := range x.dests {
					if !pool[d] {
						t.Fatalf("routed to %q, not an endpoint of the pool", d)
					}
				}
				for _, r := range x.out {
					h, m := destOf(r)
					if r.GetRequestTrailers() != nil {
						// BUFFERED trailers with no body: the headers were
						// answered already, the route goes in the metadata only.
						h = m
					}
					if h != m {
						t.Fatalf("destination header %q, metadata %q", h, m)
					} else if h != "" && h != strings.Join(x.dests, ",") {
						t.Fatalf("destination %q, dests %v", h, x.dests)
					}
				}
			}
			if done {
				break
			}
		}
		s.finish(x)
		if v := inFlight(); v != 0 {
			t.Fatalf("%v body bytes still charged after the stream", v)
		}
	})
}

// subsetMD is the subset hint (envoy.lb.subset_hint) from one byte: a
// list of endpoints, some of the pool, some not, or a malformed value.
func subsetMD(b byte) *corev3.Metadata {
	var v *structpb.Value
	switch b % 4 {
	case 0:
		v = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("10.0.0.2:8000")}})
	case 1:
		v = structpb.NewListValue(&structpb.ListValue{Values: []*structpb.Value{structpb.NewStringValue("10.0.0.9:8000"), structpb.NewNumberValue(3)}})
	case 2:
		v = structpb.NewStringValue("10.0.0.1:8000,10.0.0.2:8000")
	default:
		v = structpb.NewNumberValue(1)
	}
	return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{
		SubsetNamespace: {Fields: map[string]*structpb.Value{SubsetKey: v}},
	}}
}
