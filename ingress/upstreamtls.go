package ingress

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// TLS to https engines. The handshake is made at dial time (dialTLS), not
// left to fasthttp's first write, so a failed one fails the dial with
// crypto/tls's own error. And in TLS 1.3 an engine judges the ingress's
// client certificate after the client's side of the handshake is done: its
// refusal is an alert on the first read, which fasthttp turns into "the
// server closed connection before returning the first response byte".
// tlsConn keeps that alert for the proxy (tlsCauseOf).
//
// A refusal of the ingress's own certificate (an expired, unknown or
// missing one, or an engine whose trust bundle lacks its CA): classifyErr
// labels it client_cert_refused, the client gets a 503 naming the
// ingress's client certificate (ErrClientCertRefused) when no engine
// answered, and the engine is ejected like after a connect error, so an
// engine with a wrong trust bundle is not picked again and again. Its
// health probe, made with the same TLS config (and the client
// certificate in force), readmits it once a handshake succeeds again,
// e.g. after the certificate is renewed on disk. The engine's certificate failing verification
// (expired, unknown authority, another name) stays the engine's fault
// (connect_error, ejection), with the TLS cause in its log and metric.

// upstreamTLSLogEvery bounds the upstream TLS warnings.
const upstreamTLSLogEvery = 10 * time.Second

// Causes of upstream TLS errors (kvmesh_ingress_upstream_tls_errors_total).
const (
	tlsCauseEngineCert = "engine_certificate"         // the engine's certificate did not verify
	tlsCauseRefused    = "client_certificate_refused" // the engine refused this ingress's certificate
	tlsCauseHandshake  = "handshake"                  // any other handshake failure
)

var tlsCauses = []string{tlsCauseEngineCert, tlsCauseRefused, tlsCauseHandshake}

// engineTLSError is a failed TLS handshake with an engine, or its alert
// after it. Its text is crypto/tls's; clientText gives clients only the
// cause, as x509's may name the engine's address.
type engineTLSError struct {
	cause string
	err   error
}

func (e *engineTLSError) Error() string { return "TLS with the engine: " + e.err.Error() }
func (e *engineTLSError) Unwrap() error { return e.err }

// Timeout makes a handshake that timed out a dial timeout (classifyErr).
func (e *engineTLSError) Timeout() bool { return errors.Is(e.err, os.ErrDeadlineExceeded) }

// clientText is what a client reads of it.
func (e *engineTLSError) clientText() string {
	switch {
	case e.cause == tlsCauseRefused:
		return e.Error() // a remote alert: names no address
	case e.Timeout():
		return "TLS with the engine: handshake timed out"
	case e.cause == tlsCauseEngineCert:
		return "TLS with the engine: its certificate did not verify (the ingress's log says why)"
	}
	return "TLS with the engine: handshake failed (the ingress's log says why)"
}

// tlsCause names a TLS error's cause.
func tlsCause(err error) string {
	if refusedOurCert(err) {
		return tlsCauseRefused
	}
	var ve *tls.CertificateVerificationError
	var he x509.HostnameError
	var ue x509.UnknownAuthorityError
	var ce x509.CertificateInvalidError
	if errors.As(err, &ve) || errors.As(err, &he) || errors.As(err, &ue) || errors.As(err, &ce) {
		return tlsCauseEngineCert
	}
	return tlsCauseHandshake
}

// refusedOurCert reports whether err is an engine's TLS alert refusing the
// certificate this ingress presented, or its absence. A client receives
// certificate alerts only about its own certificate.
func refusedOurCert(err error) bool {
	oe, ok := errors.AsType[*net.OpError](err)
	if !ok || oe.Op != "remote error" || oe.Err == nil {
		return false
	}
	switch strings.TrimPrefix(oe.Err.Error(), "tls: ") {
	case "bad certificate", "unsupported certificate", "revoked certificate", "expired certificate",
		"unknown certificate", "unknown certificate authority", "access denied", "certificate required":
		return true
	}
	return false
}

// dialTLS makes the TLS handshake on ic within timeout (0: none) and
// returns the connection fasthttp uses; on failure ic is closed.
func (u *upstreams) dialTLS(ic *idleConn, cfg *tls.Config, timeout time.Duration) (net.Conn, error) {
	tc := tls.Client(ic, cfg)
	if timeout > 0 {
		// idleConn's own deadlines (SetReadDeadline is the exchange's),
		// cleared for the requests.
		deadline := time.Now().Add(timeout)
		_ = ic.SetReadDeadline(deadline)
		_ = ic.Conn.SetWriteDeadline(deadline)
	}
	err := tc.Handshake()
	if err == nil && timeout > 0 {
		_ = ic.SetReadDeadline(time.Time{})
		err = ic.Conn.SetWriteDeadline(time.Time{})
	}
	if err != nil {
		_ = ic.Close()
		if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
			// A connect timeout (classifyErr), as a dial that did not
			// complete in time; the read error would name addresses.
			te := &engineTLSError{cause: tlsCauseHandshake, err: fmt.Errorf("handshake: %w", os.ErrDeadlineExceeded)}
			u.tlsFailed(ic.up.id, te.cause, te)
			return nil, &net.OpError{Op: "dial", Net: "tcp", Err: te}
		}
		te := &engineTLSError{cause: tlsCause(err), err: err}
		u.tlsFailed(ic.up.id, te.cause, te)
		return nil, te
	}
	return &tlsConn{Conn: tc, ic: ic}, nil
}

// tlsFailed counts an upstream TLS error and warns of it, at most once per
// upstreamTLSLogEvery.
func (u *upstreams) tlsFailed(engine, cause string, err error) {
	if u.tlsErrs != nil {
		u.tlsErrs.WithLabelValues(cause).Inc()
	}
	if u.log == nil {
		return
	}
	if now, last := monotime.Now(), u.tlsLastLog.Load(); (last == 0 || now-last >= int64(upstreamTLSLogEvery)) && u.tlsLastLog.CompareAndSwap(last, now) {
		msg := "TLS with an engine failed (later failures within 10s are only counted: kvmesh_ingress_upstream_tls_errors_total)"
		if cause == tlsCauseRefused {
			msg = "an engine refused this ingress's client certificate (upstreamCertFile): renew or fix it, or the engine's trust bundle; the engine is ejected until its probe's handshake succeeds (later refusals within 10s are only counted: kvmesh_ingress_upstream_tls_errors_total)"
		}
		u.log.Warn(msg, "engine", engine, "cause", cause, "err", err)
	}
}

// tlsConn is an engine's TLS connection (fasthttp sees its Handshake
// method and adds no TLS of its own). Its reads keep the alert of an
// engine refusing this ingress's certificate.
type tlsConn struct {
	*tls.Conn
	ic *idleConn
}

func (c *tlsConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if err != nil && refusedOurCert(err) && c.ic.tlsErr.Load() == nil {
		te := &engineTLSError{cause: tlsCauseRefused, err: err}
		c.ic.tlsErr.Store(te)
		c.ic.set.tlsFailed(c.ic.up.id, tlsCauseRefused, te)
	}
	return n, err
}

// tlsCauseOf is err, or the TLS alert behind it when resp's connection
// was refused (fasthttp reports an alert before the first byte as the
// connection closed).
func tlsCauseOf(resp *fasthttp.Response, err error) error {
	if c := connOf(resp); c != nil {
		if te := c.tlsErr.Load(); te != nil {
			return te
		}
	}
	return err
}
