package ingress

import (
	"bufio"
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/sim"
)

// rawEngine answers every request on its connection with head, then a
// small completions body (head must end its header block with the body's
// Content-Length left for rawEngine to add). It is a FAKE engine for
// answers no real engine sends on cue (a malformed or huge head).
type rawEngine struct {
	ln   net.Listener
	head string
	wg   sync.WaitGroup
}

const rawBody = `{"id":"cmpl-r","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"ok","finish_reason":"length"}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`

func startRawEngine(t *testing.T, head string) *rawEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	re := &rawEngine{ln: ln, head: head}
	re.wg.Add(1)
	go func() {
		defer re.wg.Done()
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			re.wg.Add(1)
			go func() {
				defer re.wg.Done()
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					_, _ = io.Copy(io.Discard, req.Body)
					if _, err := io.WriteString(conn, re.head+"Content-Length: "+strconv.Itoa(len(rawBody))+"\r\n\r\n"+rawBody); err != nil {
						return
					}
				}
			}()
		}
	}()
	t.Cleanup(func() { ln.Close(); re.wg.Wait() })
	return re
}

func (re *rawEngine) url() string { return "http://" + re.ln.Addr().String() }

// A client's X-Request-Id that is long, or not visible ASCII, is not
// forwarded: the engine gets an id of the ingress's own (engines echo it in
// their answer's head). A short one goes through as it is.
func TestLongRequestIDReplaced(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	front, lastSent := simRecordingIDs(t)
	reg := prometheus.NewRegistry()
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: front}), Deps{Logger: quiet, Registry: reg})
	body := `{"model":"m","prompt":[1,2,3],"max_tokens":2}`
	for _, tc := range []struct{ id, want string }{
		{"req-42", "req-42"},
		{strings.Repeat("a", maxRequestID), strings.Repeat("a", maxRequestID)},
		{strings.Repeat("a", 4000), ""},
		{strings.Repeat("b", maxRequestID+1), ""},
		{"two words", ""},
	} {
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body, "X-Request-Id", tc.id)
		if st != http.StatusOK {
			t.Fatalf("id of %d bytes: %d %s", len(tc.id), st, b)
		}
		got := lastSent()
		if tc.want != "" && got != tc.want || tc.want == "" && (len(got) != 32 || strings.Contains(tc.id, got)) {
			t.Fatalf("client id of %d bytes %.20q: the engine got %.40q (%d bytes)", len(tc.id), tc.id, got, len(got))
		}
		if echo := hdr.Get("X-Request-Id"); echo != got {
			t.Fatalf("the client got X-Request-Id %.40q, the engine was sent %.40q", echo, got)
		}
	}
	if n := len(s.health.ejected()); n != 0 {
		t.Fatalf("%d engines ejected", n)
	}
}

// simRecordingIDs starts a simulator behind a recordingFront; lastSent is
// the X-Request-Id of the last request it was sent.
func simRecordingIDs(t *testing.T) (front string, lastSent func() string) {
	t.Helper()
	sm, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	var mu sync.Mutex
	var sent []string
	front = recordingFront(t, sm.URL(), func(h http.Header) {
		mu.Lock()
		sent = append(sent, h.Get("X-Request-Id"))
		mu.Unlock()
	})
	return front, func() string {
		mu.Lock()
		defer mu.Unlock()
		if len(sent) == 0 {
			return ""
		}
		return sent[len(sent)-1]
	}
}

// recordingFront is a pass-through to target that reports each request's
// headers to seen; it returns its URL.
func recordingFront(t *testing.T, target string, seen func(http.Header)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen(r.Header.Clone())
		req, _ := http.NewRequestWithContext(r.Context(), r.Method, target+r.URL.RequestURI(), r.Body)
		req.Header = r.Header.Clone()
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		defer resp.Body.Close()
		for k, v := range resp.Header {
			w.Header()[k] = v
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String()
}

// An engine's answer with a long head (here 12 KB of headers, as a proxy in
// front of it may add) is read; one over the ingress's read buffer, or one
// that is not HTTP, is a protocol error of the engine: the attempt fails
// (retried on the next engine), the engine is not ejected as a dead one is,
// and the client's error quotes nothing of the answer.
func TestUpstreamLongOrMalformedHead(t *testing.T) {
	long := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Pad: " + strings.Repeat("p", 12000) + "\r\n"
	huge := "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Secret-Pad: " + strings.Repeat("s", maxUpstreamHead+1000) + "\r\n"
	broken := "HTTP/1.1 2x0 SECRETSTATUS\r\nContent-Type: application/json\r\n"
	body := `{"model":"m","prompt":[1,2,3],"max_tokens":2}`

	reg := prometheus.NewRegistry()
	s := startIngress(t, testConfig(StaticEngine{ID: "long", Model: "m", URL: startRawEngine(t, long).url()}), Deps{Registry: reg})
	if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body); st != http.StatusOK || !strings.Contains(string(b), `"text":"ok"`) {
		t.Fatalf("a 12 KB answer head: %d %.300s", st, b)
	}

	for _, tc := range []struct{ name, head string }{{"huge", huge}, {"broken", broken}} {
		reg := prometheus.NewRegistry()
		bad := startRawEngine(t, tc.head)
		good := startRawEngine(t, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n")
		cfg := testConfig(StaticEngine{ID: "bad", Model: "m", URL: bad.url()}, StaticEngine{ID: "good", Model: "m", URL: good.url()})
		s := startIngress(t, cfg, Deps{Registry: reg})
		// Only the bad engine first: the client sees the protocol error.
		cfg1 := testConfig(StaticEngine{ID: "bad", Model: "m", URL: bad.url()})
		s1 := startIngress(t, cfg1, Deps{Registry: prometheus.NewRegistry()})
		st, _, b := post(t, http.DefaultClient, "http://"+s1.Addr()+"/v1/completions", body)
		if st < 500 || strings.Contains(string(b), "sss") || strings.Contains(string(b), "SECRET") || strings.Contains(string(b), "small read buffer") {
			t.Fatalf("%s: %d %.400s", tc.name, st, b)
		}
		if !strings.Contains(string(b), "not readable HTTP") {
			t.Fatalf("%s: the client is not told why: %.400s", tc.name, b)
		}
		if got := val(s1.m.attempts.WithLabelValues("protocol_error")); got != 1 {
			t.Fatalf("%s: protocol_error attempts %v (connect_error %v)", tc.name, got, val(s1.m.attempts.WithLabelValues("connect_error")))
		}
		if ej := s1.health.ejected(); len(ej) != 0 {
			t.Fatalf("%s: one protocol error ejected %v", tc.name, ej)
		}
		// Both engines: every request is answered (by the good engine
		// after the bad one failed), and no engine is ejected for one
		// bad answer each time... until the bad one fails
		// ConsecutiveFailures times in a row, as a 5xx engine does.
		for i := 0; i < 6; i++ {
			if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body); st != http.StatusOK {
				t.Fatalf("%s: with a good engine too, request %d: %d %.300s", tc.name, i, st, b)
			}
		}
		if val(s.m.attempts.WithLabelValues("connect_error")) != 0 {
			t.Fatalf("%s: counted as connect errors", tc.name)
		}
		for _, id := range s.health.ejected() {
			if id != "bad" {
				t.Fatalf("%s: ejected %s", tc.name, id)
			}
		}
	}
}
