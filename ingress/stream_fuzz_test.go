package ingress

import (
	"bytes"
	"io"
	"log/slog"
	"strings"
	"testing"
	"testing/iotest"
)

// FuzzProxyStream feeds arbitrary upstream bytes, in arbitrary read sizes,
// through the streaming proxy: it must never panic, must hand the client
// only whole events, and must end every stream with [DONE] (the engine's,
// or its own after an error event when the engine stopped short).
func FuzzProxyStream(f *testing.F) {
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n"), false, uint8(0))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: {\"cho"), true, uint8(1))
	f.Add([]byte("data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"completion_tokens\":3}}\n\ndata: [DONE]\n\n"), true, uint8(2))
	f.Add([]byte(": comment\n\n\n\n"), false, uint8(3))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\r\n\r\ndata: [DONE]\r\n\r\n"), false, uint8(1))
	f.Add([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\r\rdata: [DONE]\r\r"), true, uint8(2))
	f.Add([]byte("data: {\"id\":\"x\",\"choices\":[],\"usage\":{\"completion_tokens\":3}}\r\n\r\ndata: [DONE]\r\n\r\n"), false, uint8(6))
	f.Add([]byte("data: {\"error\": {\"code\": 400}}\r\n\r\ndata: [DONE]\r\n\n"), false, uint8(0))
	f.Add([]byte("data: {\"choices\":[{\"text\":\""+strings.Repeat("x", 700)+"\"}]}\n\ndata: [DONE]\n\n"), true, uint8(2))
	s, err := New(DefaultConfig(), Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, in []byte, wrap bool, mode uint8) {
		c := &call{s: s, wrap: wrap, dropUsage: mode&4 != 0}
		p := &proxyStream{c: c, up: &upstream{id: "e"}, body: fuzzReader(in, mode), buf: make([]byte, 256), wrap: wrap}
		o := drainFuzzStream(t, p, len(in), mode)
		if len(o) == 0 {
			t.Fatal("no output: a stream always ends with [DONE]")
		}
		if !bytes.HasSuffix(o, []byte("\n\n")) {
			t.Fatalf("output does not end on an event boundary: %q", o)
		}
		if !bytes.HasSuffix(o, []byte("data: [DONE]\n\n")) {
			t.Fatalf("stream does not end with [DONE]: %q", o)
		}
		if bytes.IndexByte(o, '\r') >= 0 {
			t.Fatalf("a CR reached the client (line endings are LF on the way out): %q", o)
		}
		if wrap || c.dropUsage {
			return
		}
		// Passed through: the engine's whole events, with LF line endings,
		// then the ingress's error event when the engine stopped short. An
		// event larger than the 256-byte buffer is not cut.
		lf := bytes.ReplaceAll(bytes.ReplaceAll(in, []byte("\r\n"), []byte("\n")), []byte("\r"), []byte("\n"))
		if c.errMsg != "" {
			o = o[:bytes.LastIndex(o, []byte(`data: {"error":{"message":"engine e failed mid-stream`))]
		}
		if !bytes.HasPrefix(lf, o) || len(o) > 0 && !bytes.HasSuffix(o, []byte("\n\n")) {
			t.Fatalf("not the engine's whole events: %q of %q", o, lf)
		}
	})
}

// fuzzReader reads in whole, a byte at a time or half of what is asked,
// by mode.
func fuzzReader(in []byte, mode uint8) io.Reader {
	var r io.Reader = bytes.NewReader(in)
	switch mode % 3 {
	case 1:
		r = iotest.OneByteReader(r)
	case 2:
		r = iotest.HalfReader(r)
	}
	return r
}

// drainFuzzStream reads p to its end in reads of a size mode picks and
// returns what the client got; a stream that does not end within a bound
// set by its input's size fails the test.
func drainFuzzStream(t *testing.T, p *proxyStream, inLen int, mode uint8) []byte {
	t.Helper()
	var out bytes.Buffer
	chunk := make([]byte, 1+int(mode)%64)
	for i := 0; ; i++ {
		if i > 10*inLen+10000 {
			t.Fatal("stream does not end")
		}
		n, err := p.Read(chunk)
		out.Write(chunk[:n])
		if err == io.EOF {
			return out.Bytes()
		}
		if err != nil {
			t.Fatal(err)
		}
	}
}
