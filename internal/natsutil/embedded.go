package natsutil

import (
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// Embedded is an in-process nats-server with JetStream. It is what a single
// machine runs when no NATS URL is given, and what tests run on a random port.
type Embedded struct {
	srv      *server.Server
	storeDir string
	tempDir  bool
	once     sync.Once
}

// StartEmbedded starts a server and waits until it accepts connections.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	e := &Embedded{storeDir: cfg.StoreDir}
	if e.storeDir == "" {
		dir, err := os.MkdirTemp("", "kvmesh-nats-*")
		if err != nil {
			return nil, fmt.Errorf("embedded nats: store dir: %w", err)
		}
		e.storeDir, e.tempDir = dir, true
	}
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := cfg.Port
	if port == 0 {
		port = -1
	}
	opts := &server.Options{
		ServerName: "kvmesh-embedded",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   e.storeDir,
		NoLog:      true,
		NoSigs:     true,
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		e.removeTemp()
		return nil, fmt.Errorf("embedded nats: %w", err)
	}
	go srv.Start() // owned by srv: Shutdown stops it
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		e.removeTemp()
		return nil, fmt.Errorf("embedded nats: not ready after 10s")
	}
	e.srv = srv
	return e, nil
}

// URL is the client URL of the server (nats://127.0.0.1:port).
func (e *Embedded) URL() string { return e.srv.ClientURL() }

// StoreDir is where JetStream keeps its files; tests restart a server on the
// same port and directory to simulate a NATS restart that keeps the stream.
func (e *Embedded) StoreDir() string { return e.storeDir }

// Shutdown stops the server and removes a temporary store. Safe to call twice.
func (e *Embedded) Shutdown() {
	e.once.Do(func() {
		e.srv.Shutdown()
		e.srv.WaitForShutdown()
		e.removeTemp()
	})
}

// Port is the client port the server listens on.
func (e *Embedded) Port() int {
	return e.srv.Addr().(*net.TCPAddr).Port
}

func (e *Embedded) removeTemp() {
	if e.tempDir {
		_ = os.RemoveAll(e.storeDir)
	}
}
