package ingress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// sseEngine is a FAKE engine for what the simulator never sends: events of
// hundreds of KiB, CR or CRLF line endings, a stream that breaks inside an
// event. It answers POST /v1/completions and /v1/chat/completions with body,
// written step bytes at a time with a flush after each (so events arrive
// split across reads, as over a network); with cutAt > 0 the connection
// drops after cutAt bytes. Any other path is a 404 (the ingress's /tokenize
// check then leaves the tokens alone). As vLLM, it sends the usage chunk
// (the event with "choices":[]) only when the request asks for it, unless
// forced (vLLM's --enable-force-include-usage).
type sseEngine struct {
	ln     net.Listener
	paths  chan string // request paths seen (dropped when full)
	bodies chan []byte // request bodies seen (dropped when full)
	forced atomic.Bool
}

// withoutUsage is body without its usage chunk.
func withoutUsage(body string) string {
	sep := "\n\n"
	for _, s := range []string{"\r\n\r\n", "\r\r"} {
		if strings.Contains(body, s) {
			sep = s
		}
	}
	var out []string
	for _, ev := range strings.SplitAfter(body, sep) {
		if !strings.Contains(ev, `"choices":[]`) {
			out = append(out, ev)
		}
	}
	return strings.Join(out, "")
}

func startSSEEngine(t testing.TB, body string, step, cutAt int, hdr ...string) *sseEngine {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	se := &sseEngine{ln: ln, paths: make(chan string, 64), bodies: make(chan []byte, 64)}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, ErrorLog: slogDiscard(), Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/v1/completions" && r.URL.Path != "/v1/chat/completions" {
			http.NotFound(w, r)
			return
		}
		select {
		case se.paths <- r.URL.Path:
		default:
		}
		select {
		case se.bodies <- b:
		default:
		}
		for i := 0; i+1 < len(hdr); i += 2 {
			w.Header().Set(hdr[i], hdr[i+1])
		}
		w.Header().Set("Content-Type", "text/event-stream")
		out := body
		if !se.forced.Load() && !bytes.Contains(b, []byte(`"include_usage":true`)) {
			out = withoutUsage(out)
		}
		if cutAt > 0 {
			out = body[:cutAt]
		}
		for len(out) > 0 {
			n := min(step, len(out))
			if _, err := io.WriteString(w, out[:n]); err != nil {
				return
			}
			w.(http.Flusher).Flush()
			out = out[n:]
		}
		if cutAt > 0 {
			panic(http.ErrAbortHandler) // the connection drops without the chunked body's end
		}
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return se
}

// sseData splits an LF SSE body into its events' data payloads, whatever
// their size (sseEvents' scanner stops at 64 KiB lines).
func sseData(b []byte) []string {
	var out []string
	for _, ev := range strings.Split(strings.TrimSuffix(string(b), "\n\n"), "\n\n") {
		if p, ok := strings.CutPrefix(ev, "data: "); ok {
			out = append(out, p)
		}
	}
	return out
}

func (se *sseEngine) url() string { return "http://" + se.ln.Addr().String() }

func slogDiscard() *log.Logger {
	return slog.NewLogLogger(slog.NewTextHandler(io.Discard, nil), slog.LevelError)
}

// bigLogprobsEvent is a completions chunk of about size bytes, most of it
// logprobs and prompt_token_ids, as vLLM sends with logprobs and
// return_token_ids on a long prompt; it returns the event and its logprobs.
func bigLogprobsEvent(size int) (ev, logprobs string) {
	var toks, lps, offs, ids strings.Builder
	for i := 0; toks.Len()+lps.Len()+offs.Len()+ids.Len() < size; i++ {
		if i > 0 {
			toks.WriteByte(',')
			lps.WriteByte(',')
			offs.WriteByte(',')
			ids.WriteByte(',')
		}
		fmt.Fprintf(&toks, `"tok%d"`, i)
		fmt.Fprintf(&lps, `-%d.%04d`, i%7, i%10000)
		fmt.Fprintf(&offs, `%d`, i*5)
		fmt.Fprintf(&ids, `%d`, 1000+i)
	}
	logprobs = `{"tokens":[` + toks.String() + `],"token_logprobs":[` + lps.String() + `],"top_logprobs":null,"text_offset":[` + offs.String() + `]}`
	ev = `data: {"id":"cmpl-big","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" big","logprobs":` + logprobs +
		`,"finish_reason":null}],"usage":null,"prompt_token_ids":[` + ids.String() + "]}\n\n"
	return ev, logprobs
}

// Events of any size reach the client whole and unchanged, in plain
// completions streams (the ingress's own usage chunk dropped) and in
// chat re-wrap mode, where a 200 KiB chunk used to be split at the 16 KiB
// buffer and its pieces lost or passed on as garbage. A stream that breaks
// inside a large event leaves no half event before the error event.
func TestLargeEventsWhole(t *testing.T) {
	big, bigLogprobs := bigLogprobsEvent(200 << 10)
	stream := completionEvent(0, "a", "") + big + completionEvent(2, "c", "length") +
		`data: {"id":"cmpl-big","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":7,"total_tokens":9}}` + "\n\n" +
		"data: [DONE]\n\n"

	t.Run("completions", func(t *testing.T) {
		se := startSSEEngine(t, stream, 4000, 0)
		s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: se.url()}), Deps{})
		knownUsage(s, "m", usageAsked)
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"stream":true}`)
		want := completionEvent(0, "a", "") + big + completionEvent(2, "c", "length") + "data: [DONE]\n\n" // the usage chunk the ingress asked for is dropped
		if st != 200 || string(b) != want {
			t.Fatalf("status %d, %d bytes, want %d unchanged (%.200q)", st, len(b), len(want), b)
		}
		waitSettled(t, s)
		if got := val(s.m.tokensOut); got != 7 {
			t.Fatalf("%v output tokens counted, want the usage's 7", got)
		}
	})

	t.Run("chat re-wrap", func(t *testing.T) {
		se := startSSEEngine(t, stream, 4000, 0)
		s := wrapIngress(t, se.url())
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions",
			`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true,"stream_options":{"include_usage":true}}`)
		if p := <-se.paths; st != 200 || p != "/v1/completions" {
			t.Fatalf("status %d, engine path %s: %.300s", st, p, b)
		}
		evs := sseData(b)
		if len(evs) != 6 || evs[5] != "[DONE]" {
			t.Fatalf("%d events, want the role chunk, 3 chunks, usage, [DONE]: %.300q", len(evs), b)
		}
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta    struct{ Content string } `json:"delta"`
				Logprobs json.RawMessage          `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(evs[2]), &ch); err != nil || ch.Object != "chat.completion.chunk" || len(ch.Choices) != 1 {
			t.Fatalf("the large event: %v: %.300s", err, evs[2])
		}
		if ch.Choices[0].Delta.Content != " big" || string(ch.Choices[0].Logprobs) != bigLogprobs {
			t.Fatalf("the large event's content %q, logprobs %d bytes of %d", ch.Choices[0].Delta.Content, len(ch.Choices[0].Logprobs), len(bigLogprobs))
		}
		for i, e := range evs[:5] {
			if !json.Valid([]byte(e)) {
				t.Fatalf("event %d is not JSON: %.200s", i, e)
			}
		}
	})

	t.Run("broken inside", func(t *testing.T) {
		cut := len(completionEvent(0, "a", "")) + len(big)/2
		se := startSSEEngine(t, stream, 4000, cut)
		s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: se.url()}), Deps{})
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"stream":true}`)
		evs := sseData(b)
		if st != 200 || len(evs) != 3 || evs[2] != "[DONE]" || !strings.Contains(evs[1], "failed mid-stream") {
			t.Fatalf("status %d, %d events, want the first, an error event and [DONE]: %.300q", st, len(evs), b)
		}
		for i, e := range evs[:2] {
			if !json.Valid([]byte(e)) {
				t.Fatalf("event %d is not JSON (half an event reached the client): %.200s", i, e)
			}
		}
	})
}

// knownUsage sets what the ingress has learned of model's engines (usageAsked:
// they send the usage chunk only when asked; usageForced: always), so no
// stream goes as the forced-usage probe (forcedusage.go).
func knownUsage(s *Server, model string, verdict int32) {
	st := s.forced.state(model)
	st.verdict.Store(verdict)
	st.probeAt.Store(monotime.Now())
}

// wrapIngress is an ingress in chat mode completions (re-wrap) in front of
// the engine at url, serving model llama with the test tokenizer.
func wrapIngress(t *testing.T, url string) *Server {
	t.Helper()
	nt, tpl := llama(t)
	tk, err := NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(StaticEngine{ID: "e", Model: "llama", URL: url})
	cfg.ChatMode = ChatModeCompletions
	return startIngress(t, cfg, Deps{Tokenizers: TokenizerMap{"llama": tk}})
}

// A stream's buffer grows for one large event and shrinks back once it has
// gone: at most one event is buffered, and the pooled buffer stays small.
func TestStreamBufferShrinksAfterLargeEvent(t *testing.T) {
	big, _ := bigLogprobsEvent(100 << 10)
	in := big + completionEvent(1, "b", "") + "data: [DONE]\n\n"
	s, err := New(DefaultConfig(), Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	p := streamPool.Get().(*proxyStream)
	p.reset()
	p.c, p.up, p.body = &call{s: s}, &upstream{id: "e"}, strings.NewReader(in)
	var out bytes.Buffer
	chunk := make([]byte, 1000)
	maxBuf := 0
	for {
		n, err := p.Read(chunk)
		out.Write(chunk[:n])
		maxBuf = max(maxBuf, len(p.buf))
		if err == io.EOF {
			break
		}
	}
	if out.String() != in {
		t.Fatalf("%d bytes out of %d", out.Len(), len(in))
	}
	if maxBuf < len(big) || maxBuf > 2*len(big) {
		t.Fatalf("the buffer grew to %d for a %d-byte event", maxBuf, len(big))
	}
	if len(p.buf) != streamBufSize {
		t.Fatalf("the buffer is still %d bytes after the large event, want %d", len(p.buf), streamBufSize)
	}
}

// SSE lines may end with CRLF or CR (the spec allows both; SGLang behind
// some proxies, TGI): events are split, [DONE] and the ingress's own usage
// chunk found, output tokens counted from the usage, an error event first
// recognised (a 5xx one retried elsewhere), and chat re-wrapped, as with
// LF. The client gets LF line endings. Written in 7-byte steps, a CRLF is
// often split between two reads.
func TestCRLFStreams(t *testing.T) {
	lf := completionEvent(0, "a", "") + completionEvent(1, "b", "") + completionEvent(2, "c", "length") +
		`data: {"id":"cmpl-f","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":7,"total_tokens":9}}` + "\n\n" +
		"data: [DONE]\n\n"
	wantLF := completionEvent(0, "a", "") + completionEvent(1, "b", "") + completionEvent(2, "c", "length") + "data: [DONE]\n\n"
	errFirst := "data: {\"error\": {\"message\": \"engine restarting\", \"type\": \"InternalServerError\", \"param\": null, \"code\": 500}}\n\ndata: [DONE]\n\n"
	for _, eol := range []string{"\r\n", "\r"} {
		name := map[string]string{"\r\n": "CRLF", "\r": "CR"}[eol]
		conv := func(s string) string { return strings.ReplaceAll(s, "\n", eol) }
		t.Run(name+" completions", func(t *testing.T) {
			se := startSSEEngine(t, conv(lf), 7, 0)
			s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: se.url()}), Deps{})
			knownUsage(s, "m", usageAsked) // the ingress asks for the usage chunk, and drops it
			st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"stream":true}`)
			if st != 200 || string(b) != wantLF {
				t.Fatalf("status %d: got %q, want %q", st, b, wantLF)
			}
			waitSettled(t, s)
			if got, errs := val(s.m.tokensOut), val(s.m.streamErrors); got != 7 || errs != 0 {
				t.Fatalf("%v output tokens (want the usage's 7), %v stream errors (want 0)", got, errs)
			}
		})
		t.Run(name+" error event first", func(t *testing.T) {
			bad := startSSEEngine(t, conv(errFirst), 7, 0)
			good := startSSEEngine(t, conv(lf), 7, 0)
			cfg := testConfig(StaticEngine{ID: "bad", Model: "m", URL: bad.url()}, StaticEngine{ID: "good", Model: "m", URL: good.url()})
			cfg.Scheduler.Policy = "random"
			s := startIngress(t, cfg, Deps{})
			for i := 0; len(bad.paths) == 0; i++ { // random: the bad engine comes first in about half of them
				if i == 30 {
					t.Fatal("the bad engine was never tried")
				}
				st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"stream":true}`)
				if st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" || string(b) != wantLF {
					t.Fatalf("request %d: status %d from %q: %q", i, st, hdr.Get("X-Kvmesh-Engine"), b)
				}
			}
		})
		t.Run(name+" chat re-wrap", func(t *testing.T) {
			se := startSSEEngine(t, conv(lf), 7, 0)
			s := wrapIngress(t, se.url())
			st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions",
				`{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}`)
			evs := sseEvents(b)
			if st != 200 || len(evs) != 5 || evs[4] != "[DONE]" || bytes.IndexByte(b, '\r') >= 0 {
				t.Fatalf("status %d, %d events, want the role chunk, 3 chat chunks and [DONE]: %q", st, len(evs), b)
			}
			var text strings.Builder
			for i, e := range evs[:4] {
				var ch struct {
					Object  string `json:"object"`
					Choices []struct {
						Delta struct{ Content string } `json:"delta"`
					} `json:"choices"`
				}
				if err := json.Unmarshal([]byte(e), &ch); err != nil || ch.Object != "chat.completion.chunk" || len(ch.Choices) != 1 {
					t.Fatalf("event %d: %v: %s", i, err, e)
				}
				text.WriteString(ch.Choices[0].Delta.Content)
			}
			if text.String() != "abc" {
				t.Fatalf("content %q, want abc", text.String())
			}
		})
	}
}

// loopReader serves ev again and again, in reads of at most step bytes.
type loopReader struct {
	ev   []byte
	off  int
	step int
}

func (l *loopReader) Read(b []byte) (int, error) {
	n := 0
	for n < len(b) && n < l.step {
		c := copy(b[n:min(len(b), l.step)], l.ev[l.off:])
		n += c
		l.off = (l.off + c) % len(l.ev)
	}
	return n, nil
}

// BenchmarkProxyStreamEvent is the stream's cost per passed event (framing,
// [DONE] search, output counting), with LF and with CRLF line endings: no
// allocation per event.
func BenchmarkProxyStreamEvent(b *testing.B) {
	s, err := New(DefaultConfig(), Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		b.Fatal(err)
	}
	for _, eol := range []string{"\n", "\r\n"} {
		name := map[string]string{"\n": "LF", "\r\n": "CRLF"}[eol]
		b.Run(name, func(b *testing.B) {
			ev := []byte(strings.ReplaceAll(completionEvent(1, " token", ""), "\n", eol))
			p := streamPool.Get().(*proxyStream)
			p.reset()
			p.c, p.up, p.body = &call{s: s}, &upstream{id: "e"}, &loopReader{ev: ev, step: 1500}
			out := make([]byte, 4096)
			b.ReportAllocs()
			b.SetBytes(int64(len(ev)))
			total := 0
			for total < b.N*len(ev) {
				n, err := p.Read(out)
				if err != nil {
					b.Fatal(err)
				}
				total += n
			}
			b.StopTimer()
			putStream(p)
		})
	}
}
