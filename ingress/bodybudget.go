package ingress

import (
	"fmt"
	"time"
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
	if n <= 0 {
		return nil
	}
	add := int64(n)
	held += add
	limit := s.cfg.MaxBodyBytesInFlight
	// Added, then checked, as the MaxConcurrent count: two large bodies
	// that arrive together cannot both pass on the same room.
	if used := s.bodyBytes.Add(add); limit > 0 && held > smallBody && used > limit {
		s.bodyBytes.Add(-add)
		s.m.bodyRefused.Inc()
		return fmt.Errorf("%w: this request's %d body bytes would take the request bodies this ingress holds past its own memory bound of %d bytes (--max-body-in-flight, config maxBodyBytesInFlight), not the engines' load; retry shortly",
			ErrBodyBudget, held, limit)
	}
	s.m.bodyBytes.Add(float64(add))
	return nil
}

// reserveDecoded charges, before a compressed body is decoded, the bytes
// its decoding may produce: up to maxBody (Config.MaxBodyBytes), as much as the
// budget has room for now, and at least what the always-pass rule gives
// any request (smallBody, less the held bytes). Decoding allocates its
// output as it goes, so the charge must come first: charged after it, 150
// zstd bodies of 33 KB (1 GiB of zeros each) took an ingress from 0.3 to
// 6.1 GB before their 413s. The caller decodes at most the returned bytes
// (charged to the request holding held); a body that decodes past them and
// not past maxBody is ErrBodyBudget (the room was taken), not too large.
func (s *Server) reserveDecoded(held int64, maxBody int) int64 {
	want := int64(maxBody)
	if limit := s.cfg.MaxBodyBytesInFlight; limit > 0 {
		want = min(want, limit-s.bodyBytes.Load())
	}
	free := min(max(smallBody-held, 0), int64(maxBody))     // what always passes
	if want <= free || s.holdBody(held, int(want)) != nil { // no room, or another request took it first
		want = free
		_ = s.holdBody(held, int(want)) // within smallBody: always passes (0: nothing)
	}
	return want
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

// ReserveDecoded is reserveDecoded for a front end that decodes bodies
// itself (epp/): it charges, before decoding, the bytes a compressed body
// of a request holding held bytes may decode to (at most maxBody) and
// returns them; the caller adds them to its count, decodes at most that
// many, and gives back with ReleaseBody what the decoded body does not
// keep. A body that decodes past the reservation is too large when the
// reservation is maxBody, else DecodedRefused.
func (s *Server) ReserveDecoded(held int64, maxBody int) int64 {
	return s.reserveDecoded(held, maxBody)
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
