package ingress

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"
)

// decodeBody replaces a compressed request body by its decoded bytes, so a
// client or gateway that sends Content-Encoding gzip, deflate, br or zstd is
// parsed, routed and forwarded like any other (engines such as vLLM do not
// decode request bodies themselves: the engine gets the plain JSON). The
// decoded size is bounded by MaxBodyBytes as the raw one is (a small
// compressed body may expand to gigabytes); it is checked after the
// caller is authenticated, so decoding costs only a caller that may send.
func (s *Server) decodeBody(req *fasthttp.Request) error {
	ce := bytes.TrimSpace(req.Header.ContentEncoding())
	if len(ce) == 0 || bytes.EqualFold(ce, []byte("identity")) {
		req.Header.Del(fasthttp.HeaderContentEncoding)
		return nil
	}
	if bytes.EqualFold(ce, []byte("x-gzip")) { // RFC 9110 §8.4.1.3: a recipient should read it as gzip
		req.Header.SetContentEncoding("gzip")
		ce = []byte("x-gzip")
	}
	b, err := req.BodyUncompressedWithLimit(s.cfg.MaxBodyBytes)
	switch {
	case errors.Is(err, fasthttp.ErrContentEncodingUnsupported):
		return newAPIError(fasthttp.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_content_encoding", "",
			fmt.Errorf("%w: Content-Encoding %q is not supported (gzip, deflate, br, zstd or identity)", ErrBadRequest, ce))
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return fmt.Errorf("%w: limit is %d bytes after decoding %s", ErrTooLarge, s.cfg.MaxBodyBytes, ce)
	case err != nil:
		return badRequest("", fmt.Errorf("%w: the body does not decode as Content-Encoding %s: %v", ErrBadRequest, ce, err))
	}
	req.SetBodyRaw(b) // a new buffer, not the request's
	req.Header.Del(fasthttp.HeaderContentEncoding)
	return nil
}
