package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// SSE framing as vLLM writes it: every event is one "data: <payload>" line
// followed by a blank line, and the stream ends with "data: [DONE]".
var (
	ssePrefix      = []byte("data: ")
	sseEventPrefix = []byte("event: ")
	sseDone        = []byte("[DONE]")
)

// AppendEvent appends one SSE data event carrying payload.
func AppendEvent(dst, payload []byte) []byte {
	dst = append(dst, ssePrefix...)
	dst = append(dst, payload...)
	return append(dst, '\n', '\n')
}

// AppendDone appends the terminating "data: [DONE]" event.
func AppendDone(dst []byte) []byte { return AppendEvent(dst, sseDone) }

// SSEWriter writes events to w and flushes after each one when w can flush
// (http.ResponseWriter, *bufio.Writer), so clients see tokens as they come.
// Not safe for concurrent use.
type SSEWriter struct {
	w   io.Writer
	buf []byte
}

// NewSSEWriter returns a writer on w.
func NewSSEWriter(w io.Writer) *SSEWriter { return &SSEWriter{w: w} }

// SetHeaders sets the response headers of an SSE stream.
func SetHeaders(h http.Header) {
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
}

// Data writes one event whose payload is p (one line of JSON).
func (s *SSEWriter) Data(p []byte) error {
	if bytes.ContainsAny(p, "\r\n") {
		return fmt.Errorf("sse write: %w: payload contains a line break", ErrBadStream)
	}
	s.buf = AppendEvent(s.buf[:0], p)
	return s.flush()
}

// Done writes the terminating [DONE] event.
func (s *SSEWriter) Done() error {
	s.buf = AppendDone(s.buf[:0])
	return s.flush()
}

func (s *SSEWriter) flush() error {
	if _, err := s.w.Write(s.buf); err != nil {
		return fmt.Errorf("sse write: %w", err)
	}
	switch f := s.w.(type) {
	case http.Flusher:
		f.Flush()
	case interface{ Flush() error }:
		if err := f.Flush(); err != nil {
			return fmt.Errorf("sse flush: %w", err)
		}
	}
	return nil
}

// MaxEventBytes bounds one SSE line; longer lines are a stream error.
const MaxEventBytes = 4 << 20

// SSEReader is a strict reader of vLLM-style event streams. It accepts only:
// "data: " lines (with exactly one space) each followed by a blank line,
// LF or CRLF line ends, and comment lines starting with ':' between events.
// It rejects other fields (event:, id:, retry:), multi-line events, empty or
// non-JSON payloads, anything after [DONE], and a stream that ends without
// [DONE] or in the middle of an event. Not safe for concurrent use.
type SSEReader struct {
	r      *bufio.Reader
	line   []byte
	done   bool
	events int
	named  bool // the Responses API's form (NewResponsesSSEReader)
}

// NewSSEReader returns a strict reader on r.
func NewSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: bufio.NewReaderSize(r, 4<<10)}
}

// NewResponsesSSEReader returns a reader of the Responses API's streams, as
// strict otherwise: each event may name itself on an "event: " line before
// its data line, and the stream ends at a clean end of input after at least
// one event (there is no [DONE]).
func NewResponsesSSEReader(r io.Reader) *SSEReader {
	return &SSEReader{r: bufio.NewReaderSize(r, 4<<10), named: true}
}

// Next returns the next event's payload (valid until the next call). After
// the [DONE] event it returns io.EOF once the stream is verified to end there.
// Every framing problem is an error wrapping ErrBadStream.
func (s *SSEReader) Next() ([]byte, error) {
	if s.done {
		return nil, io.EOF
	}
	for {
		line, err := s.readLine()
		if err == io.EOF {
			if s.named && s.events > 0 {
				s.done = true
				return nil, io.EOF
			}
			return nil, fmt.Errorf("%w: stream ended after %d events without data: [DONE]", ErrBadStream, s.events)
		}
		if err != nil {
			return nil, err
		}
		if len(line) == 0 {
			return nil, fmt.Errorf("%w: blank line outside an event (event %d)", ErrBadStream, s.events)
		}
		if line[0] == ':' {
			continue // comment / keep-alive
		}
		if s.named && bytes.HasPrefix(line, sseEventPrefix) {
			if line, err = s.readLine(); err != nil || !bytes.HasPrefix(line, ssePrefix) {
				return nil, fmt.Errorf("%w: event %d: an event line not followed by its data line", ErrBadStream, s.events)
			}
		}
		if !bytes.HasPrefix(line, ssePrefix) {
			return nil, fmt.Errorf("%w: event %d: line %q is not a data line", ErrBadStream, s.events, clip(line))
		}
		payload := line[len(ssePrefix):]
		blank, err := s.readLine()
		if err == io.EOF {
			return nil, fmt.Errorf("%w: event %d: stream ended inside an event", ErrBadStream, s.events)
		}
		if err != nil {
			return nil, err
		}
		if len(blank) != 0 {
			return nil, fmt.Errorf("%w: event %d: more than one line in an event", ErrBadStream, s.events)
		}
		s.events++
		if bytes.Equal(payload, sseDone) {
			s.done = true
			if _, err := s.r.Peek(1); err != io.EOF {
				if err != nil {
					return nil, fmt.Errorf("%w: after [DONE]: %v", ErrBadStream, err)
				}
				return nil, fmt.Errorf("%w: data after [DONE]", ErrBadStream)
			}
			return nil, io.EOF
		}
		if len(payload) == 0 || !json.Valid(payload) {
			return nil, fmt.Errorf("%w: event %d: payload is not JSON: %q", ErrBadStream, s.events, clip(payload))
		}
		return payload, nil
	}
}

// readLine returns one line without its LF or CRLF. A bare CR, a NUL byte or
// an over-long line is an error; io.EOF only at a clean line boundary.
func (s *SSEReader) readLine() ([]byte, error) {
	s.line = s.line[:0]
	for {
		frag, err := s.r.ReadSlice('\n')
		s.line = append(s.line, frag...)
		if len(s.line) > MaxEventBytes {
			return nil, fmt.Errorf("%w: line longer than %d bytes", ErrBadStream, MaxEventBytes)
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err == io.EOF {
			if len(s.line) == 0 {
				return nil, io.EOF
			}
			return nil, fmt.Errorf("%w: stream ended inside a line", ErrBadStream)
		}
		if err != nil {
			return nil, fmt.Errorf("sse read: %w", err)
		}
		break
	}
	l := s.line[:len(s.line)-1]
	if n := len(l); n > 0 && l[n-1] == '\r' {
		l = l[:n-1]
	}
	if bytes.IndexByte(l, '\r') >= 0 || bytes.IndexByte(l, 0) >= 0 {
		return nil, fmt.Errorf("%w: bare CR or NUL in a line", ErrBadStream)
	}
	return l, nil
}

func clip(b []byte) []byte {
	if len(b) > 80 {
		return b[:80]
	}
	return b
}

// ReadAll reads a whole stream, calling fn for each payload (valid only
// during the call). It returns nil only for a well-formed stream ending in [DONE].
func ReadAll(r io.Reader, fn func(payload []byte) error) error {
	return readAll(NewSSEReader(r), fn)
}

// ReadAllResponses is ReadAll for a Responses API stream
// (NewResponsesSSEReader).
func ReadAllResponses(r io.Reader, fn func(payload []byte) error) error {
	return readAll(NewResponsesSSEReader(r), fn)
}

func readAll(s *SSEReader, fn func(payload []byte) error) error {
	for {
		p, err := s.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		if err := fn(p); err != nil {
			return err
		}
	}
}
