package loadgen

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// A connection cut while the body is read is a disconnect, not a
// malformed stream (before: "stream", "sse read: unexpected EOF"): here
// the server declares a longer body than it sends, streamed or not, and
// closes the connection.
func TestRunDisconnectMidBody(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		openai.SetHeaders(w.Header())
		w.Header().Set("Content-Length", "100000")
		w.Write([]byte("data: " + completionEvent("a") + "\n\n"))
		w.(http.Flusher).Flush()
	}))
	t.Cleanup(srv.Close)
	for _, noStream := range []bool{false, true} {
		rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: -1, Concurrency: 1, NoStream: noStream}, sharedPrefix(t, 1, 2))
		if err != nil || rep.Errors[KindDisconnect] != 2 {
			t.Fatalf("no-stream %v: %v, errors %s", noStream, err, rep.FailureSummary())
		}
	}
}

// A reset (ECONNRESET, as the kernel reports a peer that died) while the
// body is read is a disconnect too; a stream that ends cleanly but early
// stays a stream error (the server ended it).
func TestReadBodyDisconnectKinds(t *testing.T) {
	reset := &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}
	for _, c := range []struct {
		name string
		body io.Reader
		kind string
	}{
		{"reset", io.MultiReader(strings.NewReader("data: "+completionEvent("a")+"\n\n"), errReader{reset}), KindDisconnect},
		{"unexpected EOF", io.MultiReader(strings.NewReader("data: {"), errReader{io.ErrUnexpectedEOF}), KindDisconnect},
		{"clean end without [DONE]", strings.NewReader("data: " + completionEvent("a") + "\n\n"), KindStream},
	} {
		var res Result
		readBody(context.Background(), c.body, true, Completions, false, time.Now(), &res)
		if res.ErrKind != c.kind {
			t.Errorf("%s: kind %q (%s), want %q", c.name, res.ErrKind, res.ErrMsg, c.kind)
		}
	}
}

type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }
