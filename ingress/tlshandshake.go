package ingress

import (
	"crypto/tls"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// Failed TLS handshakes on the client listener. fasthttp does not look at
// the handshake's error; the connection's first read returns it and
// handleTransportError would answer it as a malformed request, counting a
// 400 (or a 408) though nothing can be written on a connection whose
// handshake failed. They are counted apart instead, by a fixed set of
// reasons, and logged at debug, with a rate-limited info for the reasons
// an operator acts on. Plain HTTP sent to the TLS port gets net/http's
// plain-text hint (crypto/tls hands back the raw connection for it).

// Reasons a handshake failed (kvmesh_ingress_tls_handshake_errors_total).
const (
	hsNotTLS     = "not_tls"     // plain HTTP (or anything not TLS) on the TLS port
	hsClientCert = "client_cert" // the client's certificate refused, or none sent where one is required
	hsTimeout    = "timeout"     // the handshake did not complete within readTimeout
	hsClosed     = "closed"      // the client left mid-handshake
	hsProtocol   = "protocol"    // anything else: no shared version, cipher or ALPN protocol, a malformed hello
)

var handshakeReasons = []string{hsNotTLS, hsClientCert, hsTimeout, hsClosed, hsProtocol}

// handshakeLogEvery bounds the info-level handshake log.
const handshakeLogEvery = 10 * time.Second

// tlsHandshakeFailed handles err if it is the client connection's failed
// TLS handshake (true), counting and logging it; false otherwise.
func (s *Server) tlsHandshakeFailed(ctx *fasthttp.RequestCtx, err error) bool {
	tc, ok := ctx.Conn().(*tls.Conn)
	if !ok || tc.ConnectionState().HandshakeComplete {
		return false
	}
	reason := handshakeReason(err)
	s.certs.m.handshakeErrs.WithLabelValues(reason).Inc()
	ctx.SetConnectionClose()
	if rhe, ok := errors.AsType[tls.RecordHeaderError](err); ok && rhe.Conn != nil && looksLikeHTTP(rhe.RecordHeader) {
		answerPlainHTTP(rhe.Conn)
	}
	s.log.Debug("TLS handshake failed", "client", ctx.RemoteAddr().String(), "reason", reason, "err", err)
	if reason == hsClosed || reason == hsTimeout {
		return true // a client or a scanner gone; readTimeout bounds the slow
	}
	if now, last := monotime.Now(), s.hsLastLog.Load(); (last == 0 || now-last >= int64(handshakeLogEvery)) && s.hsLastLog.CompareAndSwap(last, now) {
		s.log.Info("TLS handshake with a client failed (later failures within 10s are only counted: kvmesh_ingress_tls_handshake_errors_total)",
			"client", ctx.RemoteAddr().String(), "reason", reason, "err", err)
	}
	return true
}

// handshakeReason names a failed handshake's reason.
func handshakeReason(err error) string {
	if _, ok := errors.AsType[tls.RecordHeaderError](err); ok {
		return hsNotTLS
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return hsTimeout
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, net.ErrClosed) {
		return hsClosed
	}
	if _, ok := errors.AsType[*tls.CertificateVerificationError](err); ok {
		return hsClientCert
	}
	// crypto/tls has no type for these: its texts, stable for years.
	if msg := err.Error(); strings.Contains(msg, "client didn't provide a certificate") || strings.Contains(msg, "client certificate") {
		return hsClientCert
	}
	return hsProtocol
}

// looksLikeHTTP reports whether a TLS record header is the start of an
// HTTP request (net/http's test).
func looksLikeHTTP(hdr [5]byte) bool {
	switch string(hdr[:]) {
	case "GET /", "HEAD ", "POST ", "PUT /", "OPTIO", "DELET", "PATCH", "CONNE", "TRACE":
		return true
	}
	return false
}

// plainHTTPAnswer is what a plain HTTP request to the TLS port gets, as
// from net/http but with the OpenAI error body.
var plainHTTPAnswer = func() string {
	body := string(appendErrorBody(nil, &apiError{status: 400, typ: "invalid_request_error", code: "http_to_https",
		msg: "client sent an HTTP request to an HTTPS server"}))
	return "HTTP/1.0 400 Bad Request\r\nContent-Type: application/json\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body
}()

// answerPlainHTTP writes plainHTTPAnswer on the raw connection (the send
// timeout bounds it); the connection closes after.
func answerPlainHTTP(c net.Conn) {
	_, _ = io.WriteString(c, plainHTTPAnswer)
}
