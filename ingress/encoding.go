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
// compressed body may expand to gigabytes), and charged to the body budget
// before it is decoded (decodeCharged) by a request that holds held bytes
// already: charged is what the decoded body holds of the budget on return
// (nothing on an error). It is checked after the caller is authenticated,
// so decoding costs only a caller that may send.
func (s *Server) decodeBody(req *fasthttp.Request, held int64) (charged int64, err error) {
	ce := bytes.TrimSpace(req.Header.ContentEncoding())
	if len(ce) == 0 || bytes.EqualFold(ce, []byte("identity")) {
		req.Header.Del(fasthttp.HeaderContentEncoding)
		return 0, nil
	}
	orig := req.Header.ContentEncoding()       // restored on an error: the request is left as it came
	if bytes.EqualFold(ce, []byte("x-gzip")) { // RFC 9110 §8.4.1.3: a recipient should read it as gzip
		ce = []byte("x-gzip")
		orig = append([]byte(nil), orig...)
		req.Header.SetContentEncoding("gzip")
	}
	b, charged, r, err := s.decodeCharged(held, len(req.Body()), s.cfg.MaxBodyBytes, req.BodyUncompressedWithLimit)
	if err != nil {
		if !bytes.Equal(req.Header.ContentEncoding(), orig) {
			req.Header.SetContentEncodingBytes(orig)
		}
	}
	switch {
	case errors.Is(err, fasthttp.ErrContentEncodingUnsupported):
		return 0, newAPIError(fasthttp.StatusUnsupportedMediaType, "invalid_request_error", "unsupported_content_encoding", "",
			fmt.Errorf("%w: Content-Encoding %q is not supported (gzip, deflate, br, zstd or identity)", ErrBadRequest, ce))
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return 0, s.decodedRefused(r, s.cfg.MaxBodyBytes, string(ce))
	case err != nil:
		return 0, badRequest("", fmt.Errorf("%w: the body does not decode as Content-Encoding %s: %v", ErrBadRequest, ce, err))
	}
	req.SetBodyRaw(b) // a new buffer, not the request's
	req.Header.Del(fasthttp.HeaderContentEncoding)
	return charged, nil
}
