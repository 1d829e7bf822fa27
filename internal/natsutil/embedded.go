package natsutil

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
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
// Without a StoreDir, a server on a given port with cfg.PortStore keeps its
// store in StableStoreDir(port), kept at Shutdown and taken up again by
// the next server on that port (a restarted sidecar keeps the delta stream
// and the tokenizer store, and a crash leaves no store behind but that
// one); any other, in a temporary directory removed at Shutdown.
func StartEmbedded(cfg EmbeddedConfig) (*Embedded, error) {
	e := &Embedded{storeDir: cfg.StoreDir}
	host := cfg.Host
	if host == "" {
		host = "127.0.0.1"
	}
	port := cfg.Port
	if port == 0 {
		port = -1
	}
	switch {
	case e.storeDir != "":
	case port > 0 && cfg.PortStore:
		dir, err := stableStore(host, port)
		if err != nil {
			return nil, fmt.Errorf("embedded nats: %w", err)
		}
		e.storeDir = dir
	default:
		dir, err := os.MkdirTemp("", "kvmesh-nats-*")
		if err != nil {
			return nil, fmt.Errorf("embedded nats: store dir: %w", err)
		}
		e.storeDir, e.tempDir = dir, true
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

// Shutdown stops the server and removes a temporary store (a port's
// stable store is kept for the next server on the port). Safe to call twice.
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

// StableStoreDir is the store of an embedded server on port given no
// store directory: kvmesh-nats-PORT in the temporary directory ($TMPDIR,
// else /tmp).
func StableStoreDir(port int) string {
	return filepath.Join(os.TempDir(), "kvmesh-nats-"+strconv.Itoa(port))
}

// stableStore readies StableStoreDir(port) for a server about to listen on
// host:port. The port is tried first: a server still running there (two
// sidecars given one --embedded-nats-port) would otherwise share its store
// with this one, which JetStream opens before it listens. The directory
// must be this user's own (made 0700 here): in a shared temporary
// directory another user could have made it, or a link in its place.
func stableStore(host string, port int) (string, error) {
	addr := net.JoinHostPort(host, strconv.Itoa(port))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("port %d: %w", port, err)
	}
	_ = ln.Close()
	dir := StableStoreDir(port)
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return "", fmt.Errorf("store dir: %w", err)
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return "", fmt.Errorf("store dir: %w", err)
	}
	if !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return "", fmt.Errorf("store dir %s is not a private directory (mode %v): remove it, or use another port", dir, fi.Mode())
	}
	// Private to its owner, and that owner this process's user: another
	// user of a shared /tmp could make the directory first, 0700, and
	// swap in a store of its own for the next start to load.
	if st, ok := fi.Sys().(*syscall.Stat_t); ok && int(st.Uid) != os.Getuid() {
		return "", fmt.Errorf("store dir %s belongs to uid %d, not this process's %d: remove it, or use another port", dir, st.Uid, os.Getuid())
	}
	return dir, nil
}

func (e *Embedded) removeTemp() {
	if e.tempDir {
		_ = os.RemoveAll(e.storeDir)
	}
}
