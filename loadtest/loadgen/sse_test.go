package loadgen

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// rawServer answers every request with 200 and the body body(n) gives for
// the n-th request (from 1), as an event stream: framings, truncations and
// usage blocks that internal/openai's writer would not produce.
func rawServer(t *testing.T, body func(n int) string) *httptest.Server {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		openai.SetHeaders(w.Header())
		w.Write([]byte(body(int(n.Add(1)))))
	}))
	t.Cleanup(srv.Close)
	return srv
}

// completionEvent is one completions chunk carrying text.
func completionEvent(text string) string {
	return `{"choices":[{"index":0,"text":"` + text + `"}]}`
}

const usage40 = `{"choices":[],"usage":{"prompt_tokens":40,"completion_tokens":2,"prompt_tokens_details":{"cached_tokens":32}}}`

// Streams in framings the SSE standard allows but vLLM does not write
// complete, with their usage, and are counted as non-canonical; with
// StrictSSE they are stream errors (before: every one failed with "is not
// a data line").
func TestRunLenientSSE(t *testing.T) {
	bodies := []string{
		"data:" + completionEvent("a") + "\n\ndata:" + usage40 + "\n\ndata:[DONE]\n\n",                                      // no space
		"id: 0\ndata: " + completionEvent("a") + "\n\nid: 1\nevent: m\nretry: 5\ndata: " + usage40 + "\n\ndata: [DONE]\n\n", // fields
		": hi\r\rdata: {\"choices\":\rdata: [{\"index\":0,\"text\":\"a\"}]}\r\rdata: " + usage40 + "\r\rdata: [DONE]\r\r",   // multi-line, lone CRs
	}
	srv := rawServer(t, func(n int) string { return bodies[(n-1)%len(bodies)] })
	reqs := sharedPrefix(t, 1, 3)
	rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: -1, Concurrency: 1}, reqs)
	if err != nil || rep.Completed != 3 || rep.NonCanonicalSSE != 3 {
		t.Fatalf("lenient: %v, completed %d, non-canonical %d, errors %s", err, rep.Completed, rep.NonCanonicalSSE, rep.FailureSummary())
	}
	if rep.PromptTokens != 3*40 || rep.CachedTokens != 3*32 {
		t.Fatalf("lenient: prompt %d cached %d tokens, want %d and %d", rep.PromptTokens, rep.CachedTokens, 3*40, 3*32)
	}
	for _, r := range rep.Results {
		if r.TTFT <= 0 {
			t.Fatalf("request %d: TTFT %v", r.ID, r.TTFT)
		}
	}
	var sb strings.Builder
	rep.WriteText(&sb)
	if !strings.Contains(sb.String(), "3 streams were valid SSE but not in vLLM's form") {
		t.Errorf("the text report does not name the non-canonical streams:\n%s", sb.String())
	}
	rep, err = Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: -1, Concurrency: 1, StrictSSE: true}, reqs)
	if err != nil || rep.Failed != 3 || rep.Errors[KindStream] != 3 {
		t.Fatalf("strict: %v, failed %d, errors %v", err, rep.Failed, rep.Errors)
	}
}
