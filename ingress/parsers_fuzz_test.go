package ingress

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/valyala/fasthttp"
)

// Fuzz targets of the parsers the ingress runs on what clients and engines
// send: the route's model rewrite, Content-Encoding, the named-event
// streams, the usage scans, Retry-After, /v1/models and error bodies.

// FuzzRewriteModel: a route's rewrite of the client's body names the routed
// model for every JSON parser (first-wins and last-wins alike, with the
// key escaped or not), leaves every other member as it was, and is
// idempotent.
func FuzzRewriteModel(f *testing.F) {
	for _, b := range []string{
		`{"model":"llama","prompt":"hi","max_tokens":8}`,
		`{"model":"route-a","messages":[{"role":"user","content":"hi"}],"stream":true}`,
		`{"messages":[{"role":"user","content":"{\"model\":\"x\"}"}],"model":"r"}`,
		`{"model":"a","model":"b"}`,
		`{"mod\u0065l":"a","model":"b"}`,
		`{"model":null}`,
		`{ "model" : "r" , "n" : 2 }`,
		`{"prompt":"no model"}`,
		`{"model":"r","x":{"model":"nested"}}`,
		`{"model":"r"`,
		`[]`,
		``,
	} {
		f.Add([]byte(b), "meta-llama/Llama-3.1-8B-Instruct")
	}
	f.Add([]byte(`{"model":"r"}`), "quo\"te\\ \u00e9 \x01")
	f.Fuzz(func(t *testing.T, body []byte, model string) {
		orig := bytes.Clone(body)
		out := rewriteModel(nil, body, model)
		if !bytes.Equal(body, orig) {
			t.Fatal("rewriteModel changed its input")
		}
		if again := rewriteModel(nil, out, model); !bytes.Equal(again, out) {
			t.Fatalf("not idempotent: %q then %q", out, again)
		}
		// Appending to dst keeps dst.
		if pre := rewriteModel([]byte("pre"), body, model); !bytes.Equal(pre, append([]byte("pre"), out...)) {
			t.Fatalf("dst not kept: %q", pre)
		}
		var in map[string]json.RawMessage
		if json.Unmarshal(body, &in) != nil {
			return
		}
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("a valid body became invalid JSON: %v: %q", err, out)
		}
		if _, ok := in["model"]; !ok {
			if !bytes.Equal(out, body) {
				t.Fatalf("a body without model changed: %q", out)
			}
			return
		}
		var m, want string // want: model as JSON carries it (invalid UTF-8 replaced)
		if b, err := json.Marshal(model); err != nil || json.Unmarshal(b, &want) != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(got["model"], &m); err != nil || m != want {
			t.Fatalf("model is %s after the rewrite to %q (last-wins parser)", got["model"], model)
		}
		// A first-wins parser sees the routed model too: every "model" member is it.
		firstWins := true
		for _, mb := range topMembers(t, out) {
			if mb.key == "model" {
				var s string
				if json.Unmarshal(mb.raw, &s) != nil || s != m {
					firstWins = false
				}
			}
		}
		if !firstWins {
			t.Fatalf("a \"model\" member is left unrewritten: %q", out)
		}
		delete(in, "model")
		delete(got, "model")
		if len(in) != len(got) {
			t.Fatalf("members changed: %q -> %q", body, out)
		}
		for k, v := range in {
			if !bytes.Equal(v, got[k]) {
				t.Fatalf("member %q changed: %s -> %s", k, v, got[k])
			}
		}
	})
}

type rawMember struct {
	key string
	raw json.RawMessage
}

// topMembers is every top-level member of the valid JSON object b, in order,
// duplicates included (encoding/json's map keeps only the last).
func topMembers(t *testing.T, b []byte) []rawMember {
	dec := json.NewDecoder(bytes.NewReader(b))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		t.Fatalf("not an object: %q", b)
	}
	var ms []rawMember
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, rawMember{tok.(string), raw})
	}
	return ms
}

// FuzzDecodeBody: a Content-Encoding body decodes to what was compressed,
// never to more than MaxBodyBytes; an error leaves the request as it came
// (body and header), and an unknown or broken encoding is an error, not a
// panic.
func FuzzDecodeBody(f *testing.F) {
	f.Add([]byte(`{"model":"m","prompt":"hello"}`), "gzip", uint8(0), uint16(1024))
	f.Add([]byte(`{"model":"m","prompt":"hello"}`), "deflate", uint8(0), uint16(1024))
	f.Add([]byte(`{"model":"m","prompt":"hello"}`), "br", uint8(0), uint16(1024))
	f.Add([]byte(`{"model":"m","prompt":"hello"}`), "zstd", uint8(0), uint16(1024))
	f.Add([]byte(`{"model":"m","prompt":"hello"}`), " GZIP ", uint8(0), uint16(1024))
	f.Add([]byte(strings.Repeat("a", 5000)), "gzip", uint8(0), uint16(100))
	f.Add([]byte(`{"model":"m"}`), "identity", uint8(0), uint16(10))
	f.Add([]byte(`{"model":"m"}`), "", uint8(0), uint16(10))
	f.Add([]byte("\x1f\x8b\x08\x00garbage"), "gzip", uint8(1), uint16(1024))
	f.Add([]byte(`{"model":"m"}`), "compress", uint8(1), uint16(1024))
	f.Add([]byte(`{"model":"m"}`), "gzip, br", uint8(1), uint16(1024))
	s, err := New(DefaultConfig(), Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, payload []byte, ce string, raw uint8, limit uint16) {
		s.cfg.MaxBodyBytes = 1 + int(limit)
		body := payload
		known := true
		// Over the wire a field value comes without surrounding whitespace
		// (the server's parser strips it): a header set with some is no
		// known coding here.
		if raw&1 == 0 && ce == strings.TrimSpace(ce) { // compress the payload as ce says
			switch strings.ToLower(ce) {
			case "gzip":
				body = fasthttp.AppendGzipBytes(nil, payload)
			case "deflate":
				body = fasthttp.AppendDeflateBytes(nil, payload)
			case "br":
				body = fasthttp.AppendBrotliBytes(nil, payload)
			case "zstd":
				body = fasthttp.AppendZstdBytes(nil, payload)
			default:
				known = false
			}
		} else {
			known = false
		}
		var req fasthttp.Request
		req.Header.SetMethod("POST")
		req.Header.Set(fasthttp.HeaderContentEncoding, ce)
		req.SetBody(body)
		hdr := string(req.Header.ContentEncoding())
		_, err := s.decodeBody(&req, 0)
		if err != nil {
			if !bytes.Equal(req.Body(), body) || string(req.Header.ContentEncoding()) != hdr {
				t.Fatalf("an error (%v) left the request changed", err)
			}
			var ae *apiError
			if !errors.Is(err, ErrBadRequest) && !errors.Is(err, ErrTooLarge) && !errors.As(err, &ae) {
				t.Fatalf("unclear error: %v", err)
			}
			if known && len(payload) <= s.cfg.MaxBodyBytes {
				t.Fatalf("a %s body of %d bytes (limit %d) refused: %v", ce, len(payload), s.cfg.MaxBodyBytes, err)
			}
			if known && !errors.Is(err, ErrTooLarge) {
				t.Fatalf("an oversized %s body not refused as too large: %v", ce, err)
			}
			return
		}
		if len(req.Header.ContentEncoding()) != 0 {
			t.Fatalf("Content-Encoding %q left on a decoded body", req.Header.ContentEncoding())
		}
		trimmed := strings.TrimSpace(hdr)
		if trimmed == "" || strings.EqualFold(trimmed, "identity") {
			if !bytes.Equal(req.Body(), body) {
				t.Fatal("an identity body changed")
			}
			return
		}
		if len(req.Body()) > s.cfg.MaxBodyBytes {
			t.Fatalf("decoded to %d bytes over the limit %d", len(req.Body()), s.cfg.MaxBodyBytes)
		}
		if known && !bytes.Equal(req.Body(), payload) {
			t.Fatalf("%s round trip: %q, want %q", ce, req.Body(), payload)
		}
	})
}

// FuzzNamedStreamScan: the named-event stream helpers agree with a plain
// split of the events: firstEvent is the first event holding no preamble
// mark, and a failed first event is one.
func FuzzNamedStreamScan(f *testing.F) {
	for _, s := range namedSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, events []byte) {
		for _, n := range []*namedStream{responsesStream, messagesStream} {
			ev, ok := n.firstEvent(events)
			var want []byte
			wantOK := false
			parts := bytes.Split(events, eventSep)
			for _, p := range parts[:len(parts)-1] { // the last part is unterminated
				if !containsAny(p, n.preamble) {
					want, wantOK = p, true
					break
				}
			}
			if ok != wantOK || !bytes.Equal(ev, want) {
				t.Fatalf("firstEvent = %q, %v; want %q, %v", ev, ok, want, wantOK)
			}
			if n.preambleOnly(events) == ok {
				t.Fatal("preambleOnly disagrees with firstEvent")
			}
			if n.firstEventFailed(events) && !ok {
				t.Fatal("a failed first event where there is none")
			}
			c := &call{}
			n.outTokens(c, events)
			if c.outTokens < 0 || c.outTokens > 1<<30+len(events) {
				t.Fatalf("outTokens %d", c.outTokens)
			}
			p := &proxyStream{}
			p.trackNamed(events)
			if p.nextSeq < 0 || p.nextSeq > 1<<30+1 {
				t.Fatalf("nextSeq %d", p.nextSeq)
			}
		}
	})
}

var namedSeeds = []string{
	"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\n" +
		"event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1}\n\n" +
		"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"Hi\",\"sequence_number\":2}\n\n" +
		"event: response.completed\ndata: {\"type\":\"response.completed\",\"response\":{\"usage\":{\"input_tokens\":12,\"input_tokens_details\":{\"cached_tokens\":0},\"output_tokens\":1}},\"sequence_number\":3}\n\n",
	"event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":10,\"output_tokens\":1}}}\n\n" +
		"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n" +
		"event: message_delta\ndata: {\"type\":\"message_delta\",\"usage\":{\"output_tokens\":2}}\n\n" +
		"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
	"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\nevent: error\ndata: {\"type\":\"error\",\"message\":\"boom\",\"sequence_number\":1}\n\n",
	"event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0}\n\nevent: response.failed\ndata: {\"type\":\"response.failed\",\"sequence_number\":1}\n\n",
	"event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":99999999999}\n\nevent: resp",
	"data: {\"error\":{\"message\":\"x\"}}\n\n",
	"event: content_block_delta\r\ndata: {\"type\":\"content_block_delta\"}\r\n\r\n",
	"",
	"\n\n\n\n",
}

// FuzzProxyNamedStream: the streaming proxy on the named-event streams of
// /v1/responses and /v1/messages (FuzzProxyStream drives only completions
// and chat) hands the client the engine's whole events, and, when the
// engine stopped short of its last event without an error event of its
// own, one error event of the API's shape (the Responses API's numbered
// after the last sequence number relayed).
func FuzzProxyNamedStream(f *testing.F) {
	for i, s := range namedSeeds {
		f.Add([]byte(s), uint8(i))
	}
	s, err := New(DefaultConfig(), Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in []byte, mode uint8) {
		ep, named := epResponses, responsesStream
		if mode&8 != 0 {
			ep, named = epMessages, messagesStream
		}
		c := &call{s: s, ep: ep, tokens: []uint32{1}}
		p := &proxyStream{c: c, up: &upstream{id: "e"}, body: fuzzReader(in, mode), buf: make([]byte, 256), named: named}
		o := drainFuzzStream(t, p, len(in), mode)
		lf := bytes.ReplaceAll(bytes.ReplaceAll(in, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
		relayed := o
		if c.errMsg != "" && !p.sawError {
			i := bytes.LastIndex(o, []byte("event: error\ndata: {\"type\":\"error\""))
			if i < 0 {
				t.Fatalf("a broken stream (%s) without the ingress's error event: %q", c.errMsg, o)
			}
			relayed = o[:i]
			tail := o[i:]
			if !bytes.HasSuffix(tail, []byte("\n\n")) || bytes.Count(tail, eventSep) != 1 {
				t.Fatalf("error event is not one event: %q", tail)
			}
			data := tail[len("event: error\ndata: ") : len(tail)-2]
			var ev struct {
				Seq *int `json:"sequence_number"`
			}
			if err := json.Unmarshal(data, &ev); err != nil {
				t.Fatalf("error event's data is no JSON: %v: %q", err, data)
			}
			if ep == epResponses && (ev.Seq == nil || *ev.Seq != p.nextSeq) {
				t.Fatalf("error event's sequence_number %v, want %d", ev.Seq, p.nextSeq)
			}
		}
		if !bytes.HasPrefix(lf, relayed) || len(relayed) > 0 && !bytes.HasSuffix(relayed, eventSep) {
			t.Fatalf("not the engine's whole events: %q of %q", relayed, lf)
		}
		if c.errMsg == "" && !named.ended(o) {
			t.Fatalf("a stream ended cleanly without its last event: %q", o)
		}
		if c.outTokens < 0 || c.engPrompt < 0 || c.engCached < 0 {
			t.Fatalf("negative counts: %d %d %d", c.outTokens, c.engPrompt, c.engCached)
		}
	})
}

// FuzzUsageScans: the raw-byte usage scans (no JSON decoded) agree with
// encoding/json on the compact JSON engines write: the last member of the
// name (what a last-wins parser keeps), a nonnegative integer up to 1<<30
// read as itself, anything else as 0. On any bytes they stay in bounds.
func FuzzUsageScans(f *testing.F) {
	for _, s := range []string{
		`{"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"hi","finish_reason":"length"}],"usage":{"prompt_tokens":12,"total_tokens":20,"completion_tokens":8,"prompt_tokens_details":{"cached_tokens":16}}}`,
		`{"id":"chatcmpl-1","object":"chat.completion","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6,"prompt_tokens_details":null}}`,
		`{"id":"resp_1","object":"response","usage":{"input_tokens":30,"input_tokens_details":{"cached_tokens":16},"output_tokens":4,"total_tokens":34}}`,
		`{"id":"msg_1","type":"message","usage":{"input_tokens":7,"cache_read_input_tokens":16,"output_tokens":3}}`,
		`{"choices":[{"delta":{"content":"x"}}],"usage":null}`,
		`{"usage": {"prompt_tokens": 3}}`,
		`{"usage":{"prompt_tokens":-3,"cached_tokens":1e3}}`,
		`{"usage":{"prompt_tokens":99999999999999999999}}`,
		`{"usage":{"prompt_tokens":"12"}}`,
		`{"a":{"prompt_tokens":1},"usage":{"prompt_tokens":2}}`,
		"data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":3}}\n\ndata: [DONE]\n\n",
		`{"x\"prompt_tokens":5}`,
		`"prompt_tokens":`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, ep := range []endpoint{epCompletions, epChat, epResponses, epMessages} {
			n := usagePromptTokens(ep, b)
			cn, cok := usageCachedTokens(ep, b)
			if n < 0 || n > 2<<30 || cn < 0 || cn > 1<<30 || !cok && cn != 0 {
				t.Fatalf("out of bounds: %d, %d %v", n, cn, cok)
			}
		}
		has := hasUsage(b)
		if !json.Valid(b) || bytes.IndexByte(b, '\\') >= 0 {
			return
		}
		var cb bytes.Buffer
		if err := json.Compact(&cb, b); err != nil {
			t.Fatal(err)
		}
		c := cb.Bytes()
		if hasUsage(c) != has && !has {
			t.Fatal("compacting hid a usage object")
		}
		ms := allMembers(t, c)
		last := func(key string) (any, bool) {
			var v any
			found := false
			for _, m := range ms {
				if m.key == key {
					v, found = m.first, true
				}
			}
			return v, found
		}
		count := func(key string) int {
			v, _ := last(key)
			num, ok := v.(json.Number)
			if !ok {
				return 0
			}
			s := string(num)
			if strings.TrimLeft(s, "0123456789") != "" {
				if s[0] >= '0' && s[0] <= '9' {
					return -1 // a fraction or an exponent: the scan reads the integer part
				}
				return 0
			}
			if v, err := strconv.Atoi(s); err == nil && v <= 1<<30 {
				return v
			}
			return 0
		}
		check := func(what string, got, want int) {
			if want >= 0 && got != want {
				t.Fatalf("%s: scan %d, encoding/json %d: %s", what, got, want, c)
			}
		}
		check("prompt_tokens", usagePromptTokens(epCompletions, c), count("prompt_tokens"))
		check("prompt_tokens", usagePromptTokens(epChat, c), count("prompt_tokens"))
		check("input_tokens", usagePromptTokens(epResponses, c), count("input_tokens"))
		if a, r := count("input_tokens"), count("cache_read_input_tokens"); a >= 0 && r >= 0 {
			check("input+cache_read", usagePromptTokens(epMessages, c), a+r)
		}
		for _, ep := range []endpoint{epChat, epMessages} {
			key := "cached_tokens"
			if ep == epMessages {
				key = "cache_read_input_tokens"
			}
			n, ok := usageCachedTokens(ep, c)
			_, found := last(key)
			if ok != found {
				t.Fatalf("%s: scan found %v, encoding/json %v: %s", key, ok, found, c)
			}
			check(key, n, count(key))
		}
		wantUsage := false
		for _, m := range ms {
			if m.key == "usage" && m.first == json.Delim('{') {
				wantUsage = true
			}
		}
		if hasUsage(c) != wantUsage {
			t.Fatalf("hasUsage %v, encoding/json %v: %s", hasUsage(c), wantUsage, c)
		}
	})
}

type docMember struct {
	key   string
	first any // the value's first token: a json.Delim for an object or array
}

// allMembers is every member of every object of the valid JSON b in
// document order, with the first token of its value.
func allMembers(t *testing.T, b []byte) []docMember {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	type frame struct{ obj, wantKey bool }
	var (
		stack []frame
		key   *string
		ms    []docMember
	)
	afterValue := func() {
		if n := len(stack); n > 0 && stack[n-1].obj {
			stack[n-1].wantKey = true
		}
	}
	for {
		tok, err := dec.Token()
		if err == io.EOF {
			return ms
		}
		if err != nil {
			t.Fatal(err)
		}
		n := len(stack)
		if d, ok := tok.(json.Delim); ok && (d == '}' || d == ']') {
			stack = stack[:n-1]
			afterValue()
			continue
		}
		if n > 0 && stack[n-1].obj && stack[n-1].wantKey {
			k := tok.(string)
			key = &k
			stack[n-1].wantKey = false
			continue
		}
		if key != nil {
			ms = append(ms, docMember{*key, tok})
			key = nil
		}
		if d, ok := tok.(json.Delim); ok {
			stack = append(stack, frame{obj: d == '{', wantKey: d == '{'})
			continue
		}
		afterValue()
	}
}

// FuzzRetryAfter: an engine's Retry-After, seconds or an HTTP date, is a
// wait within [1s, maxRetryAfter], the header's own value when it is in
// that range; an HTTP date written for a wait reads back as it to the
// second.
func FuzzRetryAfter(f *testing.F) {
	f.Add([]byte("120"), int64(0))
	f.Add([]byte("0"), int64(30))
	f.Add([]byte("4294967295"), int64(-5))
	f.Add([]byte("4294967296"), int64(7200))
	f.Add([]byte("-1"), int64(1))
	f.Add([]byte("Wed, 21 Oct 2015 07:28:00 GMT"), int64(59))
	f.Add([]byte(" 5"), int64(3599))
	f.Add([]byte(""), int64(1<<40))
	now := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	f.Fuzz(func(t *testing.T, v []byte, secs int64) {
		d := retryAfter(v, now)
		if d < time.Second || d > maxRetryAfter {
			t.Fatalf("Retry-After %q: %v out of [1s, %v]", v, d, maxRetryAfter)
		}
		if n, err := strconv.ParseUint(string(v), 10, 32); err == nil {
			want := min(max(time.Duration(n)*time.Second, time.Second), maxRetryAfter)
			if d != want {
				t.Fatalf("Retry-After %q: %v, want %v", v, d, want)
			}
		}
		secs %= 1 << 33 // dates a few centuries either way
		when := now.Add(time.Duration(secs) * time.Second)
		if when.Year() < 1 || when.Year() > 9999 {
			return
		}
		date := fasthttp.AppendHTTPDate(nil, when)
		want := min(max(time.Duration(secs)*time.Second, time.Second), maxRetryAfter)
		if got := retryAfter(date, now); got != want {
			t.Fatalf("Retry-After %q (%ds from now): %v, want %v", date, secs, got, want)
		}
		if got := retryAfter([]byte(strconv.FormatInt(secs, 10)), now); secs >= 0 && secs <= 1<<32-1 && got != want {
			t.Fatalf("Retry-After %d: %v, want %v", secs, got, want)
		}
	})
}

// rtFunc answers an http.Client's requests in process (no network).
type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// FuzzListModels: the identity probe's read of an engine's /v1/models
// gives the ids encoding/json reads from the same answer, in order, or an
// error and no ids.
func FuzzListModels(f *testing.F) {
	f.Add([]byte(`{"object":"list","data":[{"id":"meta-llama/Llama-3.1-8B-Instruct","object":"model","created":1700000000,"owned_by":"vllm","root":"meta-llama/Llama-3.1-8B-Instruct","parent":null,"max_model_len":8192}]}`), uint16(200))
	f.Add([]byte(`{"object":"list","data":[{"id":"a"},{"id":"b"},{"id":null},{}]}`), uint16(200))
	f.Add([]byte(`{"data":null}`), uint16(200))
	f.Add([]byte(`{"data":[{"id":5}]}`), uint16(200))
	f.Add([]byte(`{"data":[]} trailing`), uint16(200))
	f.Add([]byte(`<html>502</html>`), uint16(502))
	f.Add([]byte(`{"error":"loop"}`), uint16(508))
	f.Add([]byte(``), uint16(200))
	f.Fuzz(func(t *testing.T, body []byte, status uint16) {
		code := 100 + int(status)%500
		if status == 200 {
			code = 200
		}
		e := &ejector{hop: "ing-1", client: &http.Client{Transport: rtFunc(func(r *http.Request) (*http.Response, error) {
			if r.Header.Get(hopHeader) != "ing-1" || r.Header.Get("Authorization") != "Bearer k" {
				t.Errorf("probe headers: %v", r.Header)
			}
			h := http.Header{}
			h.Set(ingressHeader, "x")
			return &http.Response{StatusCode: code, Header: h, Body: io.NopCloser(bytes.NewReader(body)), Request: r}, nil
		})}}
		ids, err := e.listModels(t.Context(), "http://10.0.0.1:8000/v1/models", []byte("Bearer k"))
		if code != 200 {
			if err == nil || ids != nil {
				t.Fatalf("status %d: %v, %v", code, ids, err)
			}
			if (code == http.StatusLoopDetected) != errors.Is(err, ErrRoutingLoop) {
				t.Fatalf("status %d: %v", code, err)
			}
			return
		}
		var list struct {
			Data []struct {
				ID string `json:"id"`
			} `json:"data"`
		}
		jerr := json.NewDecoder(bytes.NewReader(body)).Decode(&list)
		if (err != nil) != (jerr != nil) {
			t.Fatalf("listModels error %v, encoding/json %v", err, jerr)
		}
		if err != nil {
			if ids != nil {
				t.Fatalf("ids with an error: %q", ids)
			}
			return
		}
		if len(ids) != len(list.Data) {
			t.Fatalf("ids %q, want %d", ids, len(list.Data))
		}
		for i, d := range list.Data {
			if ids[i] != d.ID {
				t.Fatalf("id %d: %q, want %q", i, ids[i], d.ID)
			}
		}
	})
}

// FuzzErrorMessage: an engine error body's message in each shape engines
// write reads back as written; a body that is no JSON is its own message.
func FuzzErrorMessage(f *testing.F) {
	f.Add([]byte(`{"object":"error","message":"The model `+"`x`"+` does not exist.","type":"NotFoundError","param":null,"code":404}`), "The model `x` does not exist.")
	f.Add([]byte(`{"error":{"message":"model not found","type":"invalid_request_error","code":"model_not_found"}}`), "m")
	f.Add([]byte(`{"detail":"Not Found"}`), "Not Found")
	f.Add([]byte(`{"detail":[{"loc":["body"],"msg":"field required"}]}`), "")
	f.Add([]byte(`Internal Server Error`), "\xff")
	f.Add([]byte(`{"error":"flat string"}`), "")
	f.Add([]byte(`{"error":null,"message":"x"}`), "")
	f.Fuzz(func(t *testing.T, body []byte, msg string) {
		got := errorMessage(body)
		if !json.Valid(body) && got != string(body) {
			t.Fatalf("non-JSON body %q read as %q", body, got)
		}
		if msg == "" || !utf8Valid(msg) {
			return
		}
		for _, shape := range []map[string]any{
			{"error": map[string]any{"message": msg, "type": "invalid_request_error", "code": 404}},
			{"object": "error", "message": msg, "type": "NotFoundError", "code": 404},
			{"detail": msg},
		} {
			b, err := json.Marshal(shape)
			if err != nil {
				t.Fatal(err)
			}
			if got := errorMessage(b); got != msg {
				t.Fatalf("%s read as %q, want %q", b, got, msg)
			}
		}
	})
}

func utf8Valid(s string) bool { return strings.ToValidUTF8(s, "\ufffd") == s }
