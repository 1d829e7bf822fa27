package openai

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
)

// LenientSSEReader reads event streams as the WHATWG HTML standard's
// server-sent events section ("Interpreting an event stream") defines them,
// for clients that must accept any conforming server (the load generator),
// where SSEReader accepts only the one form vLLM writes:
//
//   - lines end in CRLF, LF or a lone CR; a UTF-8 byte order mark at the
//     start is skipped;
//   - a line starting with ':' is a comment;
//   - "field:value" takes one optional space after the colon, and a line
//     without a colon is a field with an empty value; the data lines of one
//     event are joined with "\n"; event, id, retry and unknown fields are
//     ignored (only the data is needed);
//   - a blank line dispatches the event; an event without a data field is
//     none.
//
// What it keeps of the OpenAI protocol: an event's data is one JSON value,
// or [DONE] (surrounding spaces allowed), which ends the stream; data that is
// only whitespace is skipped as a keep-alive; the plain form must end with
// [DONE], the named form (the Responses and Messages APIs) may end instead
// at the end of input after at least one event; an event after [DONE] is an
// error, and so is the end of input with an event's data not dispatched
// (the spec discards it: here its data was cut off), except a [DONE] that
// lost its blank line. Errors wrap ErrBadStream, or the read error ("sse
// read: …").
//
// NonCanonical reports whether the stream used anything SSEReader (or, for
// the named form, the Responses reader) would have refused, so a caller can
// say that a server's framing is valid but unusual. Not safe for concurrent
// use.
type LenientSSEReader struct {
	r       *bufio.Reader
	named   bool
	line    []byte
	data    []byte // the event's data so far, each line followed by '\n'
	hasData bool
	afterCR bool // the last line ended in CR: skip a '\n' that follows
	started bool
	done    bool // [DONE] was dispatched
	ended   bool
	events  int
	// canon tracks the strict grammar (canonIdle → [canonNamed →]
	// canonData → blank line); nonCanonical sticks once it is left.
	canon        int
	nonCanonical bool
}

const (
	canonIdle  = iota // between events
	canonNamed        // after an "event: " line (named form)
	canonData         // after the event's "data: " line
)

// NewLenientSSEReader returns a lenient reader on r; named selects the
// Responses/Messages form (no [DONE] needed).
func NewLenientSSEReader(r io.Reader, named bool) *LenientSSEReader {
	return &LenientSSEReader{r: bufio.NewReaderSize(r, 4<<10), named: named}
}

// NonCanonical reports whether the stream so far used framing the strict
// reader refuses.
func (s *LenientSSEReader) NonCanonical() bool { return s.nonCanonical }

// Next returns the next event's data (valid until the next call), or io.EOF
// at the end of a complete stream.
func (s *LenientSSEReader) Next() ([]byte, error) {
	if s.ended {
		return nil, io.EOF
	}
	if !s.started {
		s.started = true
		if err := s.skipBOM(); err != nil {
			return nil, err
		}
	}
	for {
		line, complete, err := s.readLine()
		if err == io.EOF {
			return s.end()
		}
		if err != nil {
			return nil, err
		}
		if s.done || !complete || bytes.IndexByte(line, 0) >= 0 {
			s.nonCanonical = true // bytes after [DONE], a cut last line, a NUL
		}
		if len(line) == 0 {
			if s.canon != canonData {
				s.nonCanonical = true // a blank line outside an event
			}
			s.canon = canonIdle
			if !s.hasData {
				continue
			}
			s.hasData = false
			payload, err := s.dispatch(s.data[:len(s.data)-1])
			s.data = s.data[:0]
			if payload != nil || err != nil {
				return payload, err
			}
			continue
		}
		s.track(line)
		if line[0] == ':' {
			continue
		}
		field, value := line, []byte(nil)
		if i := bytes.IndexByte(line, ':'); i >= 0 {
			field, value = line[:i], line[i+1:]
			if len(value) > 0 && value[0] == ' ' {
				value = value[1:]
			}
		}
		if string(field) != "data" {
			continue // event, id, retry, or a field the spec says to ignore
		}
		if len(s.data)+len(value)+1 > MaxEventBytes {
			return nil, fmt.Errorf("%w: event data longer than %d bytes", ErrBadStream, MaxEventBytes)
		}
		s.data = append(append(s.data, value...), '\n')
		s.hasData = true
	}
}

// track follows the strict reader's grammar for a non-blank line.
func (s *LenientSSEReader) track(line []byte) {
	switch {
	case line[0] == ':':
		if s.canon != canonIdle {
			s.nonCanonical = true // a comment inside an event
		}
	case s.named && s.canon == canonIdle && bytes.HasPrefix(line, sseEventPrefix):
		s.canon = canonNamed
	case s.canon != canonData && bytes.HasPrefix(line, ssePrefix):
		s.canon = canonData
	default:
		s.nonCanonical = true // another field, or a second line of data
	}
}

// dispatch checks an event's data: the payload to return, or nil to read on.
func (s *LenientSSEReader) dispatch(payload []byte) ([]byte, error) {
	t := bytes.Trim(payload, " \t\r\n")
	switch {
	case len(t) == 0:
		s.nonCanonical = true // a keep-alive
		return nil, nil
	case s.done:
		return nil, fmt.Errorf("%w: an event after [DONE]", ErrBadStream)
	case bytes.Equal(t, sseDone):
		if len(t) != len(payload) {
			s.nonCanonical = true
		}
		s.done = true
		s.events++
		return nil, nil // read on to the end of input
	case !json.Valid(payload):
		return nil, fmt.Errorf("%w: event %d: data is not JSON: %q", ErrBadStream, s.events, clip(payload))
	}
	s.events++
	return payload, nil
}

// end is the end of input.
func (s *LenientSSEReader) end() ([]byte, error) {
	s.ended = true
	if s.canon != canonIdle {
		s.nonCanonical = true // the last event has no blank line
	}
	if s.hasData {
		s.nonCanonical = true
		t := bytes.Trim(s.data, " \t\r\n")
		if s.done || !bytes.Equal(t, sseDone) {
			return nil, fmt.Errorf("%w: event %d: stream ended inside an event (its data not dispatched)", ErrBadStream, s.events)
		}
		s.done = true
	}
	if s.done || (s.named && s.events > 0) {
		return nil, io.EOF
	}
	return nil, fmt.Errorf("%w: stream ended after %d events without data: [DONE]", ErrBadStream, s.events)
}

// skipBOM skips a UTF-8 byte order mark at the start.
func (s *LenientSSEReader) skipBOM() error {
	b, err := s.r.Peek(1)
	if len(b) == 0 || b[0] != 0xEF {
		if err != nil && err != io.EOF {
			return fmt.Errorf("sse read: %w", err)
		}
		return nil
	}
	if b, _ := s.r.Peek(3); bytes.Equal(b, []byte("\xEF\xBB\xBF")) {
		s.r.Discard(3)
		s.nonCanonical = true
	}
	return nil
}

// readLine returns the next line without its end (CRLF, LF or CR), and
// whether it had one (false: the input ended inside it); io.EOF when the
// input ended at a line boundary. It returns a line as soon as its end is
// read (a CR's LF, if any, is skipped at the next call).
func (s *LenientSSEReader) readLine() (line []byte, complete bool, err error) {
	s.line = s.line[:0]
	if s.afterCR {
		s.afterCR = false
		b, err := s.r.Peek(1)
		switch {
		case len(b) == 1 && b[0] == '\n':
			s.r.Discard(1)
		case len(b) == 1 || err == io.EOF:
			s.nonCanonical = true // a lone CR ended the last line
		default:
			return nil, false, fmt.Errorf("sse read: %w", err)
		}
	}
	for {
		b, err := s.r.Peek(max(1, s.r.Buffered()))
		if i := bytes.IndexAny(b, "\r\n"); i >= 0 {
			s.line = append(s.line, b[:i]...)
			s.afterCR = b[i] == '\r'
			s.r.Discard(i + 1)
			if len(s.line) > MaxEventBytes {
				return nil, false, fmt.Errorf("%w: line longer than %d bytes", ErrBadStream, MaxEventBytes)
			}
			return s.line, true, nil
		}
		s.line = append(s.line, b...)
		s.r.Discard(len(b))
		if len(s.line) > MaxEventBytes {
			return nil, false, fmt.Errorf("%w: line longer than %d bytes", ErrBadStream, MaxEventBytes)
		}
		if err == io.EOF {
			if len(s.line) == 0 {
				return nil, false, io.EOF
			}
			return s.line, false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("sse read: %w", err)
		}
	}
}

// ReadAllLenient reads a whole stream with a LenientSSEReader, calling fn
// for each payload (valid only during the call). It returns nil only for a
// complete stream, and whether its framing was non-canonical.
func ReadAllLenient(r io.Reader, named bool, fn func(payload []byte) error) (nonCanonical bool, err error) {
	s := NewLenientSSEReader(r, named)
	for {
		p, err := s.Next()
		if err == io.EOF {
			return s.NonCanonical(), nil
		}
		if err != nil {
			return s.NonCanonical(), err
		}
		if err := fn(p); err != nil {
			return s.NonCanonical(), err
		}
	}
}
