package epp

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"net"
	"strconv"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"github.com/valyala/fasthttp"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

func TestEndpointOf(t *testing.T) {
	cases := []struct {
		url, want string
		ok        bool
	}{
		{"http://10.0.0.5:8000", "10.0.0.5:8000", true},
		{"http://10.0.0.5:8000/v1", "10.0.0.5:8000", true},
		{"https://10.0.0.5", "10.0.0.5:443", true},
		{"http://engine-0.ns.svc", "engine-0.ns.svc:80", true},
		{"http://[fd00::1]:8000/", "[fd00::1]:8000", true},
		{"http://[fd00::1]", "[fd00::1]:80", true},
		{"http://user@10.0.0.5:8000", "10.0.0.5:8000", true},
		{"http://10.0.0.5:0", "", false},
		{"http://10.0.0.5:99999", "", false},
		{"http://:8000", "", false},
		{"http://", "", false},
		{"10.0.0.5:8000", "", false},
		{"http://fd00::1:8000", "", false},
	}
	for _, c := range cases {
		got, ok := endpointOf(c.url)
		if got != c.want || ok != c.ok {
			t.Errorf("endpointOf(%q) = %q, %v; want %q, %v", c.url, got, ok, c.want, c.ok)
		}
	}
}

func TestParseEndpointList(t *testing.T) {
	got, bad := parseEndpointList(nil, " 10.0.0.1:80 ,,10.0.0.2:8000,bogus,[::1]:9,10.0.0.3:0, 010.0.0.4:1")
	want := []string{"10.0.0.1:80", "10.0.0.2:8000", "[::1]:9"}
	if strings.Join(got, ",") != strings.Join(want, ",") || bad != 3 {
		t.Fatalf("got %v bad %d", got, bad)
	}
}

func TestMetadataEndpoints(t *testing.T) {
	list, _ := structpb.NewStruct(map[string]any{SubsetKey: []any{"10.0.0.1:80", "10.0.0.2:80,10.0.0.3:80", 7.0}})
	str, _ := structpb.NewStruct(map[string]any{SubsetKey: "10.0.0.9:80"})
	num, _ := structpb.NewStruct(map[string]any{SubsetKey: 1.0})
	md := func(s *structpb.Struct) *corev3.Metadata {
		return &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: s}}
	}
	if eps, ok, bad := metadataEndpoints(md(list), SubsetNamespace, SubsetKey); !ok || len(eps) != 3 || bad != 1 {
		t.Fatalf("list: %v %v %d", eps, ok, bad)
	}
	if eps, ok, bad := metadataEndpoints(md(str), SubsetNamespace, SubsetKey); !ok || len(eps) != 1 || eps[0] != "10.0.0.9:80" || bad != 0 {
		t.Fatalf("string: %v %v %d", eps, ok, bad)
	}
	if eps, ok, bad := metadataEndpoints(md(num), SubsetNamespace, SubsetKey); !ok || len(eps) != 0 || bad != 1 {
		t.Fatalf("number: %v %v %d", eps, ok, bad)
	}
	if _, ok, _ := metadataEndpoints(nil, SubsetNamespace, SubsetKey); ok {
		t.Fatal("absent metadata reported present")
	}
}

// FuzzEndpointOf: any URL gives a host:port that splits, or nothing.
func FuzzEndpointOf(f *testing.F) {
	for _, s := range []string{"http://10.0.0.5:8000", "https://[::1]/x", "http://a@b:1/", "http://", "http://[", "http://x:+1", "ftp://x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, url string) {
		ep, ok := endpointOf(url)
		if !ok {
			return
		}
		h, p, err := net.SplitHostPort(ep)
		if err != nil || h == "" || !validPort(p) {
			t.Fatalf("endpointOf(%q) = %q: %v", url, ep, err)
		}
	})
}

// FuzzParseEndpointList: every accepted entry is a canonical ip:port that
// parses again to itself; the counts add up.
func FuzzParseEndpointList(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80,10.0.0.2:8000", "[::1]:9", " , ,", "1.2.3.4:65536", "::1:80", "[::ffff:1.2.3.4]:80"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		eps, bad := parseEndpointList(nil, s)
		if bad < 0 || len(eps)+bad > strings.Count(s, ",")+1 {
			t.Fatalf("%q: %d endpoints, %d bad", s, len(eps), bad)
		}
		for _, ep := range eps {
			again, ok := parseEndpoint(ep)
			if !ok || again != ep {
				t.Fatalf("%q: entry %q re-parses to %q, %v", s, ep, again, ok)
			}
		}
	})
}

// FuzzParseContentLength: a value is its decimal number when it is one of
// at most 15 digits, else -1.
func FuzzParseContentLength(f *testing.F) {
	for _, s := range []string{"0", "123", "", "-1", "+5", " 5", "1e3", "999999999999999", "9999999999999999", "0x10"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n := parseContentLength(s)
		want := int64(-1)
		if v, err := strconv.ParseInt(s, 10, 64); err == nil && len(s) <= 15 && s[0] >= '0' && s[0] <= '9' {
			want = v
		}
		if int64(n) != want {
			t.Fatalf("parseContentLength(%q) = %d, want %d", s, n, want)
		}
	})
}

// FuzzJSONComplete: a valid JSON document (shallow enough for the
// scanner) is complete; an object or array cut anywhere before its end is
// not (a BUFFERED_PARTIAL body cut at the data plane's buffer is never
// routed as whole).
func FuzzJSONComplete(f *testing.F) {
	for _, s := range []string{`{"model":"m","prompt":"hi"}`, `[1,2,{"a":null}]`, ` {"a":"\u00e9\"x"} `, `{"a":[true,false,-1.5e3]}`, `{}`, `{"a":`, `"str"`, `12`} {
		f.Add([]byte(s), uint(3))
	}
	f.Fuzz(func(t *testing.T, b []byte, cut uint) {
		if len(b) <= 200 && json.Valid(b) && !jsonComplete(b) {
			t.Fatalf("valid %q: not complete", b)
		}
		i := jsonscan.SkipWS(b, 0)
		end, err := jsonscan.SkipValue(b, i)
		if err != nil || i >= len(b) || (b[i] != '{' && b[i] != '[') {
			return
		}
		k := i + int(cut%uint(end-i)) // a cut inside the value: at least its closing bracket is gone
		if jsonComplete(b[:k]) {
			t.Fatalf("%q cut at %d (%q) is complete", b[:end], k, b[:k])
		}
	})
}

// FuzzDecodeBody: any encoding and bytes decode within the limit or fail
// with an error; what decodes is what the encoder wrote (gzip); an
// encoding outside gzip, deflate, br and zstd is unsupported.
func FuzzDecodeBody(f *testing.F) {
	var gz bytes.Buffer
	w := gzip.NewWriter(&gz)
	_, _ = w.Write([]byte(`{"model":"m","prompt":"hello"}`))
	_ = w.Close()
	for _, c := range []struct{ enc, body string }{{"gzip", gz.String()}, {"gzip", "not gzip"}, {"deflate", "x"}, {"br", "\x0b"}, {"zstd", ""}, {"compress", "x"}, {"GZIP", gz.String()}, {"gzip, br", "x"}} {
		f.Add(c.enc, []byte(c.body), []byte(`{"model":"m","prompt":"hello"}`))
	}
	const limit = 1 << 16
	f.Fuzz(func(t *testing.T, enc string, body, plain []byte) {
		got, err := decodeBody(enc, body, limit)
		supported := false
		for _, e := range []string{"gzip", "deflate", "br", "zstd"} {
			supported = supported || (len(enc) == len(e) && strings.EqualFold(enc, e))
		}
		if supported == errors.Is(err, fasthttp.ErrContentEncodingUnsupported) {
			t.Fatalf("encoding %q: %v", enc, err)
		}
		if err == nil && len(got) > limit {
			t.Fatalf("%q decoded to %d bytes past the %d limit", enc, len(got), limit)
		}
		// A round trip.
		var buf bytes.Buffer
		zw := gzip.NewWriter(&buf)
		_, _ = zw.Write(plain)
		_ = zw.Close()
		got, err = decodeBody("gzip", buf.Bytes(), limit)
		if len(plain) <= limit && (err != nil || !bytes.Equal(got, plain)) {
			t.Fatalf("gzip round trip of %d bytes: %d bytes, %v", len(plain), len(got), err)
		}
		if len(plain) > limit && !errors.Is(err, fasthttp.ErrBodyTooLarge) {
			t.Fatalf("gzip of %d bytes past the limit: %v", len(plain), err)
		}
	})
}
