package ingress

import (
	"errors"
	"fmt"
	"time"

	"github.com/valyala/fasthttp"
)

// The body budget (Config.MaxBodyBytesInFlight) bounds the request body
// bytes the requests in service hold at once. MaxConcurrent bounds the
// requests, not their size, and a body costs the ingress several times its
// bytes while it is parsed and tokenized (fasthttp's buffer grown by
// doubling, the unquoted prompt, the tokenizer's scratch, GC headroom): 50
// bodies of 8 MB took a 4 GiB pod past its limit. A request is charged its
// body as the handler starts, before anything copies it, and again at its
// decoded size when it came compressed; the charge is given back once, in
// endClient, whichever way the request ends (answered, refused, its client
// gone, its stream over).
//
// The rule: a request whose charged bytes are at most smallBody always
// passes, counted; a larger one passes when the bytes held, its own
// included, stay within the budget, and is otherwise refused at once with
// 503 and Retry-After: 1 (ErrBodyBudget), never queued. Bodies still being
// received are not counted: fasthttp reads a body whole before the handler
// runs (bounded per connection by MaxBodyBytes and ReadTimeout).

// smallBody is the size of body that always passes the budget: ordinary
// requests are served while large ones are refused, so one client's large
// bodies cannot starve everyone else's. It is unauthBodyLimit (header.go),
// the most an unauthenticated request may send.
const smallBody = unauthBodyLimit

// holdBody charges n more bytes of the request's body to the server's
// bytes in flight, or returns ErrBodyBudget and charges nothing. Bytes are
// counted with the budget off too (kvmesh_ingress_body_bytes_in_flight).
func (c *call) holdBody(n int) error {
	if err := c.s.holdBody(c.bodyHeld, n); err != nil {
		return err
	}
	if n > 0 {
		c.bodyHeld += int64(n)
	}
	return nil
}

// holdBody charges n more bytes to a request that holds held bytes already.
func (s *Server) holdBody(held int64, n int) error {
	if !s.tryHold(held, n) {
		s.m.bodyRefused.Inc()
		held += int64(n)
		limit := s.cfg.MaxBodyBytesInFlight
		return fmt.Errorf("%w: this request's %d body bytes would take the request bodies this ingress holds past its own memory bound of %d bytes (--max-body-in-flight, config maxBodyBytesInFlight), not the engines' load; retry shortly",
			ErrBodyBudget, held, limit)
	}
	return nil
}

// tryHold is holdBody's rule without its refusal: false charges nothing
// and counts nothing (decodeCharged's steps, refused once for the request).
func (s *Server) tryHold(held int64, n int) bool {
	if n <= 0 {
		return true
	}
	add := int64(n)
	held += add
	limit := s.cfg.MaxBodyBytesInFlight
	// Added, then checked, as the MaxConcurrent count: two large bodies
	// that arrive together cannot both pass on the same room.
	if used := s.bodyBytes.Add(add); limit > 0 && held > smallBody && used > limit {
		s.bodyBytes.Add(-add)
		return false
	}
	s.m.bodyBytes.Add(float64(add))
	return true
}

// decodeCharged decodes a compressed body of compressed bytes with decode
// (fasthttp's, which stops past its limit with fasthttp.ErrBodyTooLarge),
// charging its decoded bytes to the body budget before they are made:
// decoding allocates its output as it goes, and charged after it, 150 zstd
// bodies of 33 KB (1 GiB of zeros each) took an ingress from 0.3 to 6.1 GB
// before their 413s. It reserves a first guess (8× the compressed size, at
// least 64 KiB) and, while the body decodes past the reservation, doubles
// it up to maxBody and decodes again (at most twice the work of one
// decode); reserving maxBody at once refused the fifth of many small gzip
// bodies decoding together (a 32 MiB limit against a 128 MiB budget). A
// step the budget has no room for stops it, as a plain body past the room
// is refused, but within the always-pass rule (smallBody, less held: the
// bytes the request holds already). On success the decoded body keeps its
// own size charged (charged), the rest is given back; on an error nothing
// stays charged and r is the last reservation (for decodedRefused: past
// maxBody too large, else the budget's refusal).
func (s *Server) decodeCharged(held int64, compressed, maxBody int, decode func(limit int) ([]byte, error)) (b []byte, charged, r int64, err error) {
	free := min(max(smallBody-held, 0), int64(maxBody)) // what always passes
	r = min(int64(maxBody), max(8*int64(compressed), 64<<10))
	if r <= free || !s.tryHold(held, int(r)) {
		r = free
		s.tryHold(held, int(r)) // within smallBody: always passes (0: nothing)
	}
	for {
		b, err = nil, fasthttp.ErrBodyTooLarge
		if r > 0 { // fasthttp reads a limit of 0 as none
			b, err = decode(int(r))
		}
		if !errors.Is(err, fasthttp.ErrBodyTooLarge) || r >= int64(maxBody) {
			break
		}
		next := min(int64(maxBody), max(2*r, 64<<10))
		if !s.tryHold(held+r, int(next-r)) {
			break // no room for the next step
		}
		r = next
	}
	if err != nil {
		s.ReleaseBody(r)
		return nil, 0, r, err
	}
	s.ReleaseBody(r - int64(len(b)))
	return b, int64(len(b)), r, nil
}

// decodedRefused is the error of a body that decoded past its reservation
// (reserveDecoded) r: too large past maxBody, else the budget refusal.
func (s *Server) decodedRefused(r int64, maxBody int, encoding string) error {
	if r >= int64(maxBody) {
		return fmt.Errorf("%w: limit is %d bytes after decoding %s", ErrTooLarge, maxBody, encoding)
	}
	s.m.bodyRefused.Inc()
	return fmt.Errorf("%w: this request's body decodes (%s) past the %d bytes the request bodies this ingress holds leave room for under its own memory bound of %d bytes (--max-body-in-flight, config maxBodyBytesInFlight), not the engines' load; retry shortly",
		ErrBodyBudget, encoding, r, s.cfg.MaxBodyBytesInFlight)
}

// releaseBody gives back the request's body bytes; endClient calls it once.
func (c *call) releaseBody() {
	c.s.ReleaseBody(c.bodyHeld)
	c.bodyHeld = 0
}

// HoldBody is the body budget for a front end that buffers request bodies
// itself and asks Pick for the decision (the gateway's endpoint picker,
// epp/): it charges n more bytes to a request that holds held bytes already
// (the caller keeps that count, adding n on success), by the rule above. A
// refusal is a *PickError in the ingress's edge form (503, Retry-After, the
// OpenAI error body) wrapping ErrBodyBudget, and charges nothing. Give the
// bytes back with ReleaseBody exactly once, whichever way the request ends.
func (s *Server) HoldBody(held int64, n int) error {
	if err := s.holdBody(held, n); err != nil {
		return budgetPickError(err)
	}
	return nil
}

// budgetPickError is a body budget refusal in the ingress's edge form.
func budgetPickError(err error) *PickError {
	ae := toAPIError(err)
	return &PickError{Status: ae.status, Body: appendErrorBody(nil, ae), RetryAfter: int((ae.retryAfter + time.Second - 1) / time.Second), Err: err}
}

// DecodeCharged is decodeCharged for a front end that decodes bodies
// itself (epp/): it decodes a compressed body of a request holding held
// bytes with decode, charging the decoded bytes to the body budget before
// they are made, and returns the body and the bytes it keeps charged (the
// caller adds them to its count and gives them back with ReleaseBody). On
// fasthttp.ErrBodyTooLarge, r below maxBody is the budget's refusal
// (DecodedRefused), else the body is too large; nothing stays charged.
func (s *Server) DecodeCharged(held int64, compressed, maxBody int, decode func(limit int) ([]byte, error)) (b []byte, charged, r int64, err error) {
	return s.decodeCharged(held, compressed, maxBody, decode)
}

// DecodedRefused is the body budget's refusal of a body that decoded past
// a reservation below maxBody, in HoldBody's form (*PickError, 503).
func (s *Server) DecodedRefused(r int64, maxBody int, encoding string) error {
	return budgetPickError(s.decodedRefused(r, maxBody, encoding))
}

// ReleaseBody gives back n body bytes charged with HoldBody.
func (s *Server) ReleaseBody(n int64) {
	if n <= 0 {
		return
	}
	s.bodyBytes.Add(-n)
	s.m.bodyBytes.Sub(float64(n))
}
