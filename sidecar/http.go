package sidecar

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// AdminAddr is the admin server's address once Run started it (nil before).
func (s *Sidecar) AdminAddr() net.Addr {
	if a := s.admin.Load(); a != nil {
		return a
	}
	return nil
}

// serveAdmin starts /health, /ready, /metrics and /debug/state; the returned
// func stops the server.
func (s *Sidecar) serveAdmin() (func(), error) {
	ln, err := net.Listen("tcp", s.cfg.AdminAddr)
	if err != nil {
		return nil, fmt.Errorf("sidecar admin: %w", err)
	}
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		s.admin.Store(a)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /ready", func(w http.ResponseWriter, _ *http.Request) {
		if !s.Ready() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /debug/state", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(s.Status())
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(s.gather, promhttp.HandlerOpts{}))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	done := make(chan struct{})
	go func() { // owned by the returned stop func
		defer close(done)
		_ = srv.Serve(ln)
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(ctx)
		<-done
	}, nil
}
