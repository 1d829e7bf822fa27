package webhook

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// Path is where the webhook is served.
const Path = "/mutate-pods"

// maxBody bounds an AdmissionReview (the API server sends at most ~3 MiB objects).
const maxBody = 8 << 20

func intstrPort(p int) intstr.IntOrString { return intstr.FromInt32(int32(p)) }

// Handler serves AdmissionReview v1 requests for pods.
type Handler struct {
	Sidecar SidecarConfig
	Log     *slog.Logger
}

// ServeHTTP decodes the review, computes the patch and answers.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "POST only", http.StatusMethodNotAllowed)
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		reviews.WithLabelValues("bad_request").Inc()
		http.Error(w, "body too large or unreadable", http.StatusBadRequest)
		return
	}
	resp, err := h.Review(body)
	if err != nil {
		reviews.WithLabelValues("bad_request").Inc()
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// ErrBadReview is a request that is not an AdmissionReview for a pod.
var ErrBadReview = errors.New("bad admission review")

// Review turns an AdmissionReview request into its response.
func (h *Handler) Review(body []byte) (*admissionv1.AdmissionReview, error) {
	var in admissionv1.AdmissionReview
	if err := json.Unmarshal(body, &in); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadReview, err)
	}
	if in.Request == nil {
		return nil, fmt.Errorf("%w: no request", ErrBadReview)
	}
	out := &admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Response: &admissionv1.AdmissionResponse{UID: in.Request.UID, Allowed: true},
	}
	if in.Request.Kind.Kind != "Pod" {
		reviews.WithLabelValues("skipped").Inc()
		return out, nil
	}
	var pod corev1.Pod
	if err := json.Unmarshal(in.Request.Object.Raw, &pod); err != nil {
		return nil, fmt.Errorf("%w: pod: %w", ErrBadReview, err)
	}
	patch, err := h.Sidecar.patchFor(&pod)
	switch {
	case err != nil:
		reviews.WithLabelValues("rejected").Inc()
		out.Response.Allowed = false
		out.Response.Result = &metav1.Status{Status: metav1.StatusFailure, Code: http.StatusUnprocessableEntity,
			Reason: metav1.StatusReasonInvalid, Message: "kvmesh sidecar injection: " + err.Error()}
	case patch == nil:
		reviews.WithLabelValues("skipped").Inc()
	default:
		reviews.WithLabelValues("injected").Inc()
		pt := admissionv1.PatchTypeJSONPatch
		out.Response.Patch, out.Response.PatchType = patch, &pt
		if h.Log != nil {
			h.Log.Debug("injected sidecar", "namespace", in.Request.Namespace, "pod", pod.Name+pod.GenerateName)
		}
	}
	return out, nil
}

// Server is the webhook's HTTPS server: the webhook on Path, liveness on
// /healthz (it serves) and readiness on /readyz (its certificate is the one
// the API server is told to trust).
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Listen binds addr with a fixed certificate, always ready; Serve runs it.
func Listen(addr string, cert tls.Certificate, h http.Handler) (*Server, error) {
	return listen(addr, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil }, nil, h)
}

// listen binds addr; each TLS handshake presents getCert's certificate, so
// a rotated one is served from the next connection on. ready (nil: always)
// answers /readyz.
func listen(addr string, getCert func(*tls.ClientHelloInfo) (*tls.Certificate, error), ready func() error, h http.Handler) (*Server, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	mux := http.NewServeMux()
	mux.Handle(Path, h)
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if ready != nil {
			if err := ready(); err != nil {
				http.Error(w, err.Error(), http.StatusServiceUnavailable)
				return
			}
		}
		w.WriteHeader(http.StatusOK)
	})
	var log *slog.Logger
	if wh, ok := h.(*Handler); ok {
		log = wh.Log
	}
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{GetCertificate: getCert, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       30 * time.Second,
		ErrorLog:          stdlog.New(&serverLog{log: logger(log), getCert: getCert}, "", 0),
	}
	return &Server{srv: srv, ln: ln}, nil
}

// handshakeWarnEvery bounds the warning of failed TLS handshakes.
const handshakeWarnEvery = time.Minute

// serverLog is the webhook server's ErrorLog, so that net/http's lines go
// through slog (--log-format, --log-level). A failed TLS handshake is
// counted (kvmesh_webhook_tls_handshake_errors_total) and logged at debug;
// one a client did not merely abandon is also warned of, once per
// handshakeWarnEvery, with the served certificate's expiry and issuer (the
// API server says why it refused it only in its own answer). Anything else
// net/http reports is logged at error.
type serverLog struct {
	log      *slog.Logger
	getCert  func(*tls.ClientHelloInfo) (*tls.Certificate, error)
	lastWarn atomic.Int64 // monotime of the last warning; 0: never
}

func (l *serverLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	rest, ok := strings.CutPrefix(msg, "http: TLS handshake error from ")
	if !ok {
		l.log.Error("webhook server", "err", msg)
		return len(p), nil
	}
	tlsHandshakeErrors.Inc()
	client, reason, _ := strings.Cut(rest, ": ")
	l.log.Debug("TLS handshake with the webhook failed", "client", client, "err", reason)
	if reason == "EOF" || strings.Contains(reason, "connection reset") || strings.Contains(reason, "timeout") {
		return len(p), nil // a client gone or slow, not the certificate's doing
	}
	now, last := monotime.Now(), l.lastWarn.Load()
	if last != 0 && now-last < int64(handshakeWarnEvery) || !l.lastWarn.CompareAndSwap(last, now) {
		return len(p), nil
	}
	attrs := []any{"client", client, "err", reason}
	if c, err := l.getCert(nil); err == nil && len(c.Certificate) > 0 {
		if leaf, err := x509.ParseCertificate(c.Certificate[0]); err == nil {
			attrs = append(attrs, "servedNotAfter", leaf.NotAfter.UTC().Format(time.RFC3339), "servedIssuer", leaf.Issuer.String())
		}
	}
	l.log.Warn("TLS handshake with the webhook failed (more within "+handshakeWarnEvery.String()+
		" are only counted: kvmesh_webhook_tls_handshake_errors_total)", attrs...)
	return len(p), nil
}

// Addr is the bound address.
func (s *Server) Addr() string { return s.ln.Addr().String() }

// Serve serves until ctx ends, then shuts down (5 s grace).
func (s *Server) Serve(ctx context.Context) error {
	errc := make(chan error, 1)
	go func() { errc <- s.srv.ServeTLS(s.ln, "", "") }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.srv.Shutdown(sctx)
		<-errc
		return nil
	}
}
