package ingress

import (
	"bytes"
	"errors"
	"io"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// answerBody is a whole non-streamed answer handed to fasthttp as the
// response body. The request stays in service until fasthttp has written
// it or the client is gone (CloseWithError calls finish): its
// MaxConcurrent slot and the in-flight gauge count an answer held for a
// client that does not read (up to maxUpstreamBody each), and the send
// timeout (sendtimeout.go) ends the wait. Before, finish ran as the
// handler returned and such answers piled up in memory uncounted. The
// engine's side of the request (endEngine: admission, the policy's record,
// what is learned from the answer) ends as the answer is handed over, not
// when the client has read it. The pooled read buffer is the body (no copy
// into the response), returned to bufPool when the body closes.
type answerBody struct {
	c   *call
	buf *bytes.Buffer // from bufPool; nil when the body is not in it
	rd  bytes.Reader
}

var answerPool = sync.Pool{New: func() any { return new(answerBody) }}

var (
	_ fasthttp.ReadCloserWithError = (*answerBody)(nil)
	_ io.WriterTo                  = (*answerBody)(nil)
)

// sendAnswer makes out (which may live in buf, a bufPool buffer the body
// returns there) the response body, ends the engine's side of the request
// (endEngine: the engine is done with it) and leaves the rest of finishing
// it to the body's close. c.status and c.errMsg are the request's unless
// the body is not written whole. Nothing may touch c after it but fasthttp.
func (c *call) sendAnswer(ctx *fasthttp.RequestCtx, buf *bytes.Buffer, out []byte) {
	// endEngine stops the client watcher here, in the handler, as its stop
	// needs (clientwatch.go); a client that leaves now fails the write
	// instead.
	c.endEngine(time.Since(c.start))
	b := answerPool.Get().(*answerBody)
	b.c, b.buf = c, buf
	b.rd.Reset(out)
	ctx.Response.SetBodyStream(b, len(out))
}

func (b *answerBody) Read(p []byte) (int, error) { return b.rd.Read(p) }

// WriteTo hands fasthttp the answer in one write (sendConn waits for the
// client as long as it keeps taking bytes).
func (b *answerBody) WriteTo(w io.Writer) (int64, error) { return b.rd.WriteTo(w) }

// CloseWithError finishes the request once fasthttp is done with the body:
// werr is nil when it was written, else why not (the client stopped
// reading, or went away).
func (b *answerBody) CloseWithError(werr error) error {
	c := b.c
	if c == nil {
		return nil // closed already
	}
	if werr != nil {
		c.status = 499
		if errors.Is(werr, errSendTimeout) {
			c.errMsg = werr.Error()
		} else {
			c.errMsg = "client closed the connection before its answer was written"
		}
	}
	if b.buf != nil {
		bufPool.Put(b.buf)
	}
	b.c, b.buf = nil, nil
	b.rd.Reset(nil)
	answerPool.Put(b)
	c.finish()
	return nil
}
