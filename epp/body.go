package epp

import (
	"errors"
	"io"
	"strconv"
	"strings"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/openai"
)

// What the picker reads of a request body's framing: its content-length
// (charged to the body budget, or refused past --max-body, before the body
// comes; and to tell a BUFFERED_PARTIAL body cut at the data plane's
// buffer from a whole one that trailers follow) and its content-encoding
// (decoded as the ingress decodes it, ingress/encoding.go).

// parseContentLength is a content-length header's value, -1 when it is not
// a plain decimal number of at most 15 digits (the data plane validates
// it; an odd one is read as none: the body is then charged as it comes).
func parseContentLength(v string) int {
	if v == "" || len(v) > 15 {
		return -1
	}
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// contentEncoding is a content-encoding header's value as decoding reads
// it: trimmed, and "" for identity (nothing to decode).
func contentEncoding(v string) string {
	v = strings.TrimSpace(v)
	if strings.EqualFold(v, "identity") {
		return ""
	}
	return v
}

// decodeBody returns body decoded from encoding (gzip, deflate, br or
// zstd, in any ASCII case, as the ingress takes them), at most limit
// bytes, in a new buffer. Errors: fasthttp.ErrContentEncodingUnsupported
// (any other value), fasthttp.ErrBodyTooLarge, or why the bytes do not
// decode.
func decodeBody(encoding string, body []byte, limit int) ([]byte, error) {
	var decode func(*fasthttp.Request, int) ([]byte, error)
	switch asciiLower(encoding) {
	case "gzip":
		decode = (*fasthttp.Request).BodyGunzipWithLimit
	case "deflate":
		decode = (*fasthttp.Request).BodyInflateWithLimit
	case "br":
		decode = (*fasthttp.Request).BodyUnbrotliWithLimit
	case "zstd":
		decode = (*fasthttp.Request).BodyUnzstdWithLimit
	default:
		return nil, fasthttp.ErrContentEncodingUnsupported
	}
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.SetBodyRaw(body)
	b, err := decode(req, limit)
	req.SetBodyRaw(nil)
	return b, err
}

// asciiLower lower-cases ASCII letters only (content codings are
// case-insensitive ASCII tokens; no Unicode folding makes one of another).
func asciiLower(s string) string {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c >= 'A' && c <= 'Z' {
			b := []byte(s)
			for j := i; j < len(b); j++ {
				if c := b[j]; c >= 'A' && c <= 'Z' {
					b[j] = c + 'a' - 'A'
				}
			}
			return string(b)
		}
	}
	return s
}

// decode replaces a body sent with a content-encoding by its decoded bytes,
// which go to the engine in its place without the header (engines such as
// vLLM do not decode request bodies), charged to the body budget as well;
// true: refused (and answered). The refusals are the ingress's: 415 for an
// encoding it does not decode, 413 past Config.MaxBodyBytes decoded, 503
// past what the body budget had room for, 400 for bytes that do not decode.
func (x *exchange) decode() bool {
	// Charged before decoding, which allocates as it goes (ingress.DecodeCharged).
	maxBody := x.s.cfg.MaxBodyBytes
	b, charged, r, err := x.s.ing.DecodeCharged(x.held, len(x.body), maxBody, func(limit int) ([]byte, error) {
		return decodeBody(x.encoding, x.body, limit)
	})
	switch {
	case errors.Is(err, fasthttp.ErrContentEncodingUnsupported):
		x.s.m.results.WithLabelValues("bad_encoding").Inc()
		return x.reject(415, openai.AppendError(nil, "content-encoding "+strconv.Quote(x.encoding)+" is not supported (gzip, deflate, br, zstd or identity)",
			"invalid_request_error", "", "unsupported_content_encoding"), 0, "kvmesh_epp_unsupported_encoding")
	case errors.Is(err, fasthttp.ErrBodyTooLarge) && r < int64(maxBody): // the budget's room, not the limit
		return x.budgetRefused(x.s.ing.DecodedRefused(r, maxBody, x.encoding))
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return x.tooLarge(x.encoding)
	case err != nil && x.partial && x.length < 0 && errors.Is(err, io.ErrUnexpectedEOF):
		return x.truncated() // a BUFFERED_PARTIAL body cut at the data plane's buffer
	case err != nil:
		x.s.m.results.WithLabelValues("bad_encoding").Inc()
		return x.reject(400, openai.AppendError(nil, "the body does not decode as content-encoding "+x.encoding+": "+err.Error(),
			"invalid_request_error", "", ""), 0, "kvmesh_epp_bad_encoding")
	}
	x.held += charged
	x.body, x.newBody, x.decoded = b, true, true
	return false
}

// jsonComplete reports whether b holds one whole JSON value (whatever
// follows it): false for a body cut short, and for one malformed before
// its end.
func jsonComplete(b []byte) bool {
	_, err := jsonscan.SkipValue(b, jsonscan.SkipWS(b, 0))
	return err == nil
}
