package ingress

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// GET /v1/responses/{id}?stream=true (following a background response,
// resuming a dropped stream) relays the engine's events as they come: the
// client reads the first before the engine has sent the rest. Before, the
// whole stream was buffered until the engine finished. The engine is a
// FAKE (the simulator stores responses but does not stream them by id).
func TestResponseByIDStreams(t *testing.T) {
	gate, seen := make(chan struct{}), make(chan string, 1)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		seen <- r.URL.RequestURI()
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte("event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"sequence_number\":3,\"delta\":\"a\"}\n\n"))
		w.(http.Flusher).Flush()
		select {
		case <-gate:
		case <-r.Context().Done():
			return
		}
		_, _ = w.Write([]byte("event: response.completed\ndata: {\"type\":\"response.completed\",\"sequence_number\":4}\n\n"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + ln.Addr().String()}), Deps{})

	var tag [respTagLen]byte
	engineTag(tag[:], "e")
	id := respIDPrefix + string(tag[:]) + strings.Repeat("0", 32)
	type head struct {
		resp  *http.Response
		rd    *bufio.Reader
		first string
		err   error
	}
	got := make(chan head, 1)
	go func() {
		resp, err := http.Get("http://" + s.Addr() + "/v1/responses/" + id + "?stream=true&starting_after=2")
		if err != nil {
			got <- head{err: err}
			return
		}
		rd := bufio.NewReader(resp.Body)
		line, err := rd.ReadString('\n')
		got <- head{resp, rd, line, err}
	}()
	var h head
	select {
	case h = <-got:
	case <-time.After(30 * time.Second): // bounded: buffered, nothing would come before the gate
		close(gate)
		t.Fatal("no event before the engine finished: the stream is buffered")
	}
	if h.err != nil {
		t.Fatal(h.err)
	}
	defer h.resp.Body.Close()
	if uri := <-seen; uri != "/v1/responses/"+id+"?stream=true&starting_after=2" {
		t.Fatalf("the engine was asked %q", uri)
	}
	if h.resp.StatusCode != 200 || !strings.HasPrefix(h.resp.Header.Get("Content-Type"), "text/event-stream") || !strings.Contains(h.first, "response.output_text.delta") {
		t.Fatalf("%d %q, first line %q", h.resp.StatusCode, h.resp.Header.Get("Content-Type"), h.first)
	}
	rd := h.rd
	close(gate)
	var rest strings.Builder
	for {
		line, err := rd.ReadString('\n')
		rest.WriteString(line)
		if err != nil {
			break
		}
	}
	if !strings.Contains(rest.String(), "response.completed") {
		t.Fatalf("rest of the stream: %q", rest.String())
	}
}
