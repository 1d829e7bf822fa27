package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// sseEvents reads a named-event stream (the Responses and Messages APIs)
// strictly: every event is an "event: <type>" line, a "data: <json>" line
// whose type is the same (and, with seq, whose sequence_number counts from
// 0, as the Responses API's does), and a blank line.
type sseEvents struct {
	t    *testing.T
	r    *bufio.Reader
	seq  bool
	next int
}

type sseEv struct {
	typ  string
	data []byte
	m    map[string]any
}

func (e *sseEvents) line() (string, error) {
	l, err := e.r.ReadString('\n')
	if err != nil {
		if err == io.EOF && l != "" {
			return "", fmt.Errorf("stream ended inside a line %q", l)
		}
		return "", err
	}
	return strings.TrimSuffix(l, "\n"), nil
}

// read returns the next event, or io.EOF at a clean end of stream.
func (e *sseEvents) read() (sseEv, error) {
	l, err := e.line()
	if err != nil {
		return sseEv{}, err
	}
	typ, ok := strings.CutPrefix(l, "event: ")
	if !ok {
		return sseEv{}, fmt.Errorf("event %d: line %q is not an event line", e.next, l)
	}
	l, err = e.line()
	if err != nil {
		return sseEv{}, fmt.Errorf("event %d: %v", e.next, err)
	}
	data, ok := strings.CutPrefix(l, "data: ")
	if !ok {
		return sseEv{}, fmt.Errorf("event %d: line %q is not a data line", e.next, l)
	}
	if l, err = e.line(); err != nil || l != "" {
		return sseEv{}, fmt.Errorf("event %d: no blank line after the data (%q, %v)", e.next, l, err)
	}
	ev := sseEv{typ: typ, data: []byte(data)}
	if err := json.Unmarshal(ev.data, &ev.m); err != nil {
		return sseEv{}, fmt.Errorf("event %d: %v: %s", e.next, err, data)
	}
	if ev.m["type"] != typ {
		return sseEv{}, fmt.Errorf("event %d: data type %v under event %q", e.next, ev.m["type"], typ)
	}
	if n, ok := ev.m["sequence_number"].(float64); e.seq && (!ok || int(n) != e.next) {
		return sseEv{}, fmt.Errorf("event %d: sequence_number %v", e.next, ev.m["sequence_number"])
	}
	e.next++
	return ev, nil
}

func (e *sseEvents) must() sseEv {
	e.t.Helper()
	ev, err := e.read()
	if err != nil {
		e.t.Fatal(err)
	}
	return ev
}

// rest reads to the end of the stream.
func (e *sseEvents) rest() []sseEv {
	e.t.Helper()
	var out []sseEv
	for {
		ev, err := e.read()
		if err == io.EOF {
			return out
		}
		if err != nil {
			e.t.Fatal(err)
		}
		out = append(out, ev)
	}
}

// streamPost starts a streamed request to path (the Responses or Messages
// API) and returns once the headers are in; seq checks sequence numbers
// as the Responses API's events carry them.
func streamPost(t *testing.T, s *Server, path string, body map[string]any, seq bool) (*http.Response, *sseEvents) {
	t.Helper()
	body["stream"] = true
	b, _ := json.Marshal(body)
	resp, err := http.Post(s.URL()+path, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream; charset=utf-8" {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), msg)
	}
	return resp, &sseEvents{t: t, r: bufio.NewReader(resp.Body), seq: seq}
}

// respStreamPost starts a streamed Responses request.
func respStreamPost(t *testing.T, s *Server, body map[string]any) (*http.Response, *sseEvents) {
	t.Helper()
	return streamPost(t, s, "/v1/responses", body, true)
}

// msgStreamPost starts a streamed Messages request.
func msgStreamPost(t *testing.T, s *Server, body map[string]any) (*http.Response, *sseEvents) {
	t.Helper()
	return streamPost(t, s, "/v1/messages", body, false)
}

// streamRestartAndDisconnect starts a long stream with post and, at its
// first delta event, restarts the engine: it returns the stream's last
// event. Then it starts another, holds the engine at its first delta and
// closes the connection: the engine request must be aborted, not finished.
func streamRestartAndDisconnect(t *testing.T, s *Server, post func() (*http.Response, *sseEvents), delta string) sseEv {
	t.Helper()
	_, ev := post()
	for ev.must().typ != delta {
	}
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	all := ev.rest()
	last := all[len(all)-1]

	resp, ev := post()
	for ev.must().typ != delta {
	}
	rk := s.ranks[0]
	rk.hold(true) // no more steps: the request can only leave the engine by an abort
	t.Cleanup(func() { rk.hold(false) })
	if l := s.Load(0); l.Running != 1 {
		t.Fatalf("running %d", l.Running)
	}
	resp.Body.Close()
	testutil.WaitFor(t, 10*time.Second, "the abandoned request to be aborted", func() bool {
		l := s.Load(0)
		return l.Running+l.Waiting == 0
	})
	if l := s.Load(0); l.Finished != 0 {
		t.Fatalf("%d requests finished, want the abandoned one aborted", l.Finished)
	}
	return last
}
