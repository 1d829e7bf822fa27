package natsutil

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Conn is a NATS connection, its JetStream handle and, when no URL was
// configured, the embedded server it runs. Close is idempotent and ordered:
// drain the connection, then stop the server.
type Conn struct {
	NC       *nats.Conn
	JS       jetstream.JetStream // nil when Config.Stream.Disabled
	Embedded *Embedded           // nil when connected to external servers

	cfg  Config
	once sync.Once
	// With WaitForServer, ensureLoop (owned by Connect, ended by Close)
	// ensures the stream after each (re)connect.
	connected chan struct{}
	quit      chan struct{}
	wg        sync.WaitGroup
}

// Connect validates cfg, starts the embedded server when cfg.URLs is empty,
// connects (retrying in the background after the first success, as
// configured) and ensures the delta stream.
func Connect(ctx context.Context, cfg Config, log *slog.Logger) (*Conn, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.Default()
	}
	c := &Conn{cfg: cfg}
	urls := cfg.URLs
	if len(urls) == 0 {
		e, err := StartEmbedded(cfg.Embedded)
		if err != nil {
			return nil, err
		}
		c.Embedded = e
		urls = []string{e.URL()}
		log.Info("started embedded nats server", "url", e.URL(), "store", e.StoreDir())
	}
	c.connected, c.quit = make(chan struct{}, 1), make(chan struct{})
	opts, err := options(cfg, log, c.signalConnected)
	if err != nil {
		c.Close()
		return nil, err
	}
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("nats connect: %w", err)
	}
	c.NC = nc
	if !nc.IsConnected() {
		log.Warn("nats not reachable yet; connecting in the background", "urls", strings.Join(cfg.URLs, ","))
	}
	if !cfg.Stream.Disabled {
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024),
			// An ack that never comes frees its pending slot after this.
			jetstream.WithPublishAsyncTimeout(5*time.Second))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("jetstream: %w", err)
		}
		c.JS = js
		if !cfg.WaitForServer {
			if _, err := EnsureStream(ctx, js, cfg.Stream); err != nil {
				c.Close()
				return nil, err
			}
		} else {
			if nc.IsConnected() {
				c.signalConnected()
			}
			c.wg.Add(1)
			go func() { defer c.wg.Done(); c.ensureLoop(log) }()
		}
	}
	return c, nil
}

func (c *Conn) signalConnected() {
	select {
	case c.connected <- struct{}{}:
	default:
	}
}

// ensureLoop ensures the stream after each (re)connect, retrying while the
// connection stays up: a server that comes up late, or comes back without
// its store, gets the stream again.
func (c *Conn) ensureLoop(log *slog.Logger) {
	for {
		select {
		case <-c.quit:
			return
		case <-c.connected:
		}
		for n := 0; c.NC.IsConnected(); n++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, err := EnsureStream(ctx, c.JS, c.cfg.Stream)
			cancel()
			if err == nil {
				break
			}
			log.Warn("ensure delta stream", "err", err)
			select {
			case <-c.quit:
				return
			case <-time.After(min(time.Duration(n+1)*250*time.Millisecond, 5*time.Second)):
			}
		}
	}
}

// Close drains nothing (kvmesh messages are soft state) and closes the
// connection, then stops an embedded server. Safe to call twice.
func (c *Conn) Close() {
	c.once.Do(func() {
		if c.quit != nil {
			close(c.quit)
		}
		if c.NC != nil {
			c.NC.Close()
		}
		c.wg.Wait()
		if c.Embedded != nil {
			c.Embedded.Shutdown()
		}
	})
}

// options builds the connection's options; connected is called on each
// (re)connect.
func options(cfg Config, log *slog.Logger, connected func()) ([]nats.Option, error) {
	opts := []nats.Option{
		nats.Name(cfg.Name),
		nats.Timeout(cfg.ConnectTimeout),
		nats.ReconnectWait(cfg.ReconnectWait),
		nats.MaxReconnects(cfg.MaxReconnects),
		nats.ReconnectBufSize(cfg.ReconnectBufSize),
		nats.RetryOnFailedConnect(cfg.WaitForServer),
		nats.ConnectHandler(func(nc *nats.Conn) { // with WaitForServer: the first connection, made late
			log.Info("nats connected", "url", nc.ConnectedUrlRedacted())
			connected()
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err == nil {
				return // our own Close
			}
			log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
			connected()
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			// Slow consumers drop messages; receivers see the gap and resync.
			log.Warn("nats async error", "subject", subject, "err", err)
		}),
	}
	switch {
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	case cfg.NKeySeedFile != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeedFile)
		if err != nil {
			return nil, fmt.Errorf("nats nkey seed: %w", err)
		}
		opts = append(opts, o)
	case cfg.CredsFile != "":
		opts = append(opts, nats.UserCredentials(cfg.CredsFile))
	}
	if cfg.TLSCAFile != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCAFile))
	}
	if cfg.TLSCertFile != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCertFile, cfg.TLSKeyFile))
	}
	if cfg.TLSInsecureSkipVerify {
		opts = append(opts, nats.Secure(&tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12})) //nolint:gosec // explicit operator choice
	}
	return opts, nil
}

// EnsureStream creates the KVMESH_DELTAS stream on kvmesh.delta.> or updates
// its limits to cfg. Old deltas are discarded first when a limit is hit.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg StreamConfig) (jetstream.Stream, error) {
	storage := jetstream.FileStorage
	if cfg.Memory {
		storage = jetstream.MemoryStorage
	}
	sc := jetstream.StreamConfig{
		Name:        StreamName,
		Description: "kvmesh KV-cache deltas (DESIGN.md Contract 2); soft state, bounded",
		Subjects:    []string{DeltaWildcard},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cfg.MaxBytes,
		Replicas:    cfg.Replicas,
		Storage:     storage,
	}
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil && errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		s, err = js.UpdateStream(ctx, sc)
	}
	if err != nil {
		return nil, fmt.Errorf("ensure stream %s: %w", StreamName, err)
	}
	return s, nil
}
