package natsutil

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Conn is a NATS connection, its JetStream handle and, when no URL was
// configured, the embedded server it runs. Close is idempotent and ordered:
// drain the connection, then stop the server.
type Conn struct {
	// Subjects are the installation's subjects and stream name
	// (Config.Prefix): every user of the connection takes them from here.
	Subjects Subjects
	NC       *nats.Conn
	JS       jetstream.JetStream // nil when Config.Stream.Disabled
	Embedded *Embedded           // nil when connected to external servers

	cfg  Config
	once sync.Once
	// ensureLoop (owned by Connect, ended by Close) ensures the stream
	// after each (re)connect (connected, with WaitForServer) and when a
	// publish failed in a way a missing stream explains (check).
	connected chan struct{}
	check     chan struct{}
	quit      chan struct{}
	wg        sync.WaitGroup
	// pubErr is told of each JetStream publish that failed after
	// PublishAsync returned (OnPublishError).
	pubErr atomic.Pointer[func(subject string, err error)]
	// pubOK is told of each JetStream publish the stream acked
	// (OnPublishOK).
	pubOK atomic.Pointer[func()]
	// denied holds the watchers told of each permission violation the
	// server reports (OnPermissionViolation), in the order they were added.
	deniedMu   sync.Mutex
	denied     []permWatcher
	deniedNext uint64
	// up is Connected: set by the connection's (re)connect handlers,
	// cleared by its disconnect and close handlers.
	up atomic.Bool
	// maxPayload is MaxPayload: the server's max_payload, stored by
	// Connect and by the (re)connect handlers.
	maxPayload atomic.Int64
	// replicasWarned: a cluster's refusal of the stream's auto replicas
	// has been logged (once per connection, not on every ensure).
	replicasWarned atomic.Bool
	// short: the stream has fewer replicas than auto asked for (set by
	// Connect's ensure before ensureLoop starts, then by ensureLoop only).
	short bool
}

// MaxPayload is the max_payload of the server the connection last
// connected to (0 before the first connection): stored when it connects
// and on each reconnect, before anything is told of it, and one atomic
// load, unlike nats.Conn's MaxPayload (the connection's lock).
func (c *Conn) MaxPayload() int64 { return c.maxPayload.Load() }

// Connected reports whether the connection is up, as its handlers last
// said: true from the (re)connect handler on, false from the disconnect
// (or close) handler on. It is one atomic load and never waits, unlike
// nats.Conn's IsConnected and Status: those take the connection's lock,
// which nats.go's reconnect loop holds through each connect attempt (a dial
// and the wait for the server's INFO, up to ConnectTimeout) — against a hung
// server, one that accepts TCP and never answers, almost all the time.
// Anything on a request path asks Connected instead. It lags the
// connection's real state by the handlers' dispatch (nats.go runs them on
// its own goroutine, in order), so it is a hint: a publish it allowed may
// still fail.
func (c *Conn) Connected() bool { return c.up.Load() }

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
	subj, err := cfg.Subjects()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err)
	}
	c := &Conn{cfg: cfg, Subjects: subj}
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
	if host := openServer(cfg.URLs, cfg.Auth); host != "" {
		log.Warn("nats without credentials to a server off loopback: anyone who reaches it can read every engine's block keys and publish deltas, state and tokenizers as a sidecar would; give the server users (manifests/base/nats.yaml) and --nats-user/--nats-password, --nats-creds or --nats-nkey (docs/SECURITY.md, \"NATS\")", "server", host)
	}
	c.connected, c.check, c.quit = make(chan struct{}, 1), make(chan struct{}, 1), make(chan struct{})
	opts, err := options(cfg, log, &c.up, c.onConnect, c.permissionViolation)
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
	if nc.IsConnected() { // the handler, on nats.go's goroutine, may not have run yet
		c.maxPayload.CompareAndSwap(0, nc.MaxPayload())
	} else {
		log.Warn("nats not reachable yet; connecting in the background", "urls", strings.Join(RedactURLs(cfg.URLs), ","))
	}
	if !cfg.Stream.Disabled {
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1024),
			// An ack that never comes frees its pending slot after this.
			jetstream.WithPublishAsyncTimeout(PublishAckTimeout),
			jetstream.WithPublishAsyncErrHandler(func(_ jetstream.JetStream, msg *nats.Msg, err error) {
				c.publishFailed(msg, err)
			}),
			jetstream.WithPublishAsyncAckHandler(func(jetstream.JetStream, *nats.Msg, *jetstream.PubAck) {
				if fn := c.pubOK.Load(); fn != nil {
					(*fn)()
				}
			}))
		if err != nil {
			c.Close()
			return nil, fmt.Errorf("jetstream: %w", err)
		}
		c.JS = js
		if !cfg.WaitForServer {
			_, short, err := ensureStream(ctx, js, subj, cfg.Stream, log, &c.replicasWarned)
			if err != nil {
				c.Close()
				return nil, err
			}
			c.short = short
		} else if nc.IsConnected() {
			c.signalConnected()
		}
		c.wg.Add(1)
		go func() { defer c.wg.Done(); c.ensureLoop(log) }()
	}
	return c, nil
}

// PublishAckTimeout is how long a JetStream publish waits for its ack
// before it fails (jetstream.ErrAsyncPublishTimeout, reported that long
// after the publish was sent).
const PublishAckTimeout = 5 * time.Second

// OnPublishError sets fn to be told of every JetStream publish that failed
// after PublishAsync returned: no ack within the 5 s timeout, no stream
// answering, an error from the stream, or an ack lost with the connection.
// fn runs on a NATS goroutine and must not block; nil removes it. Such a
// failure (but a lost connection, whose reconnect ensures the stream anyway)
// also has the connection check, at most once a second, that the stream
// exists, and create it again when it does not (it was deleted while NATS
// stayed up).
func (c *Conn) OnPublishError(fn func(subject string, err error)) {
	if fn == nil {
		c.pubErr.Store(nil)
		return
	}
	c.pubErr.Store(&fn)
}

// OnPublishOK sets fn to be told of every JetStream publish the stream
// acked: with OnPublishError, it tells when failing publishes recover. fn
// runs on the ack goroutine for every ack and must be cheap and never
// block; nil removes it.
func (c *Conn) OnPublishOK(fn func()) {
	if fn == nil {
		c.pubOK.Store(nil)
		return
	}
	c.pubOK.Store(&fn)
}

// OnPermissionViolation adds fn to the watchers told of every permission
// violation the server reports on the connection (a refused subscription or
// publish: NATS says so asynchronously, naming the subject in the error)
// and returns a func that removes it. Watchers are told in the order they
// were added, on nats.go's callback goroutine, in the order the server's
// errors arrived; fn must not block. Unlike the connection's LastError,
// which the next error overwrites (a refused JetStream request a moment
// later), every violation reaches every watcher. Once remove has returned,
// fn is not called again.
func (c *Conn) OnPermissionViolation(fn func(err error)) (remove func()) {
	c.deniedMu.Lock()
	defer c.deniedMu.Unlock()
	id := c.deniedNext
	c.deniedNext++
	c.denied = append(c.denied, permWatcher{id, fn})
	return func() {
		c.deniedMu.Lock()
		defer c.deniedMu.Unlock()
		c.denied = slices.DeleteFunc(c.denied, func(w permWatcher) bool { return w.id == id })
	}
}

type permWatcher struct {
	id uint64
	fn func(error)
}

// permissionViolation tells the OnPermissionViolation watchers of err. It
// holds the lock across the calls (each short and non-blocking), so a
// watcher removed meanwhile is not called after its remove returned.
func (c *Conn) permissionViolation(err error) {
	c.deniedMu.Lock()
	defer c.deniedMu.Unlock()
	for _, w := range c.denied {
		w.fn(err)
	}
}

// publishFailed is the JetStream async error handler.
func (c *Conn) publishFailed(msg *nats.Msg, err error) {
	subject := ""
	if msg != nil {
		subject = msg.Subject
	}
	if !errors.Is(err, nats.ErrDisconnected) {
		select { // coalesced: one check covers every failure until it runs
		case c.check <- struct{}{}:
		default:
		}
	}
	if fn := c.pubErr.Load(); fn != nil {
		(*fn)(subject, err)
	}
}

// onConnect is the (re)connect handlers' part: the new server's
// max_payload, then the stream check.
func (c *Conn) onConnect(nc *nats.Conn) {
	c.maxPayload.Store(nc.MaxPayload())
	c.signalConnected()
}

func (c *Conn) signalConnected() {
	select {
	case c.connected <- struct{}{}:
	default:
	}
}

// streamCheckEvery spaces the stream checks publish failures ask for.
const streamCheckEvery = time.Second

// replicasRetryEvery spaces the ensures that ask a cluster again for the
// replicas auto wanted and could not place (a NATS server that was still
// starting when the stream was made, one down for maintenance).
const replicasRetryEvery = time.Minute

// ensureLoop ensures the stream after each (re)connect, retrying while the
// connection stays up: a server that comes up late, or comes back without
// its store, gets the stream again. A publish failure asks for the same
// check (a stream deleted while NATS stayed up), at most once a second. A
// stream short of the replicas auto asked for is ensured again every
// replicasRetryEvery until the cluster places them.
func (c *Conn) ensureLoop(log *slog.Logger) {
	// A refused JetStream API request is not answered, so it looks like a
	// stream without a leader: the permission violation the server reports
	// beside it tells the two apart (tester h-prefix F5: a prefix whose
	// stream the user's permissions do not name).
	var deniedAPI atomic.Pointer[string]
	defer c.OnPermissionViolation(func(err error) {
		if msg := err.Error(); strings.Contains(msg, "$JS.API.") && strings.Contains(msg, c.Subjects.Stream()) {
			deniedAPI.Store(&msg)
		}
	})()
	retry := time.NewTimer(replicasRetryEvery)
	retry.Stop()
	defer retry.Stop()
	for {
		checked := false
		var retryC <-chan time.Time // nil: never
		if c.short {
			retry.Reset(replicasRetryEvery)
			retryC = retry.C
		}
		select {
		case <-c.quit:
			return
		case <-c.connected:
		case <-c.check:
			checked = true
		case <-retryC:
		}
		retry.Stop()
		for n := 0; c.NC.IsConnected(); n++ {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			_, short, err := ensureStream(ctx, c.JS, c.Subjects, c.cfg.Stream, log, &c.replicasWarned)
			cancel()
			if err == nil {
				c.short = short
				break
			}
			if d := deniedAPI.Swap(nil); d != nil && streamUnanswered(err) {
				log.Warn("ensure delta stream: the NATS user may not use the stream's JetStream API (the server refused it: "+*d+
					"); allow $JS.API.STREAM.INFO, .CREATE and .UPDATE on "+c.Subjects.Stream()+" for the sidecars' user (manifests/base/nats.yaml, docs/SECURITY.md)", "err", err)
			} else if streamUnanswered(err) {
				// The reason this matters is not in err: say what is lost and what is not.
				log.Warn("ensure delta stream: the stream does not answer (it has no leader or its JetStream quorum is lost, "+
					"e.g. a NATS server down or an election, or JetStream is unavailable); deltas still reach running ingresses "+
					"over plain NATS, but the stream misses every delta whose ack fails: `kvmesh inspect stream` shows the holes, "+
					"and an ingress starting meanwhile discovers idle engines from gossip only", "err", err)
			} else {
				log.Warn("ensure delta stream", "err", err)
			}
			select {
			case <-c.quit:
				return
			case <-time.After(min(time.Duration(n+1)*250*time.Millisecond, 5*time.Second)):
			}
		}
		if checked { // publishes fail for a while before the first ack times out: do not ask the server for each
			select {
			case <-c.quit:
				return
			case <-time.After(streamCheckEvery):
			}
		}
	}
}

// streamUnanswered reports whether err is the stream's JetStream not
// answering at all (a request timed out, no responders, JetStream not
// enabled or temporarily unavailable), as opposed to refusing the stream.
func streamUnanswered(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) ||
		errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) ||
		errors.As(err, &api) && api.ErrorCode == jsClusterNotAvailable
}

// jsClusterNotAvailable is JetStream's "JetStream system temporarily
// unavailable" (no meta leader).
const jsClusterNotAvailable = 10008

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

// options builds the connection's options; up follows the connection (set
// on each (re)connect, cleared on each disconnect and on close) and
// connected is called on each (re)connect; denied is told of each
// permission violation the server reports. The handlers run in order on
// nats.go's callback goroutine; up is set before anything that could take
// the connection's lock.
func options(cfg Config, log *slog.Logger, up *atomic.Bool, connected func(*nats.Conn), denied func(error)) ([]nats.Option, error) {
	ping, pings := cfg.pings()
	subj, _ := cfg.Subjects() // logged at connect; Connect refused an invalid prefix
	opts := []nats.Option{
		nats.Name(cfg.Name),
		// A path that stays up and carries nothing is found by pings alone.
		nats.PingInterval(ping),
		nats.MaxPingsOutstanding(pings),
		// A path that stops taking bytes while we write is not: a write
		// stuck on a full socket holds the connection's lock, and the ping
		// timer waits for that lock, so nats.go's 1 min write timeout was
		// the bound (a hung server held a sidecar's publisher, and its
		// shutdown, that long). A write the server takes nothing of for
		// as long as the pings allow is the same dead path: it fails and
		// the connection is redialed at once.
		nats.FlusherTimeout(cfg.StaleAfter()),
		nats.ReconnectOnFlusherError(),
		nats.Timeout(cfg.ConnectTimeout),
		nats.ReconnectWait(cfg.ReconnectWait),
		nats.MaxReconnects(cfg.MaxReconnects),
		nats.ReconnectBufSize(cfg.ReconnectBufSize),
		nats.RetryOnFailedConnect(cfg.WaitForServer),
		nats.ConnectHandler(func(nc *nats.Conn) { // the first connection (with WaitForServer: made late)
			up.Store(true)
			log.Info("nats connected", "url", nc.ConnectedUrlRedacted(), "prefix", subj.Prefix(), "stream", subj.Stream())
			connected(nc)
		}),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			up.Store(false)
			if err == nil {
				return // our own Close
			}
			if errors.Is(err, nats.ErrStaleConnection) {
				log.Warn("nats disconnected: pings unanswered, the path is dead", "err", err,
					"ping_interval", ping, "max_pings_outstanding", pings)
				return
			}
			log.Warn("nats disconnected", "err", err)
		}),
		nats.ReconnectErrHandler(connectFailed(cfg, log, time.Now)),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			up.Store(true)
			log.Info("nats reconnected", "url", nc.ConnectedUrlRedacted())
			connected(nc)
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			up.Store(false)
			// nats.go gives up on a server that refuses the credentials
			// twice; nothing reconnects after this, so say why loudly.
			if err := nc.LastError(); errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrAuthExpired) || errors.Is(err, nats.ErrAuthRevoked) {
				log.Error("nats refused this client's credentials; not connecting again (check the NATS user, password, token, nkey or creds file)",
					"err", err)
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				denied(err)
			}
			if sub != nil {
				// Slow consumers drop messages; receivers see the gap and resync.
				log.Warn("nats async error", "subject", sub.Subject, "err", err)
				return
			}
			// The server's error names no subscription (a refused
			// subscription, a permission, a protocol error): say so
			// rather than log an empty subject.
			if errors.Is(err, nats.ErrMaxSubscriptionsExceeded) {
				log.Warn("nats async error (connection-level: the server names no subscription); a subscription was refused: raise the NATS account's or server's max_subscriptions", "err", err)
				return
			}
			log.Warn("nats async error (connection-level: the server names no subscription)", "err", err)
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

// connectErrEvery spaces the warnings of one repeated connect error.
const connectErrEvery = 30 * time.Second

// connectFailed is the handler of each failed (re)connect attempt, the
// first connection's included when it is made in the background: it warns
// with the reason (an unknown CA, a wrong server name, a refused dial), at
// once for a reason not seen before and at most every connectErrEvery for
// the same one, counting the attempts in between. Without it a TLS error
// was never logged: the components said "nats not reachable yet" and
// nothing more, while NATS logged a handshake error every second. It runs
// on nats.go's callback goroutine only, so its state needs no lock. The
// password and token are replaced if the error ever holds them.
func connectFailed(cfg Config, log *slog.Logger, now func() time.Time) nats.ConnErrHandler {
	var (
		last     time.Time
		lastMsg  string
		repeated int
	)
	urls := strings.Join(RedactURLs(cfg.URLs), ",")
	return func(_ *nats.Conn, err error) {
		if err == nil {
			return
		}
		msg := err.Error()
		for _, secret := range []string{cfg.Password, cfg.Token} {
			if secret != "" {
				msg = strings.ReplaceAll(msg, secret, Redacted)
			}
		}
		t := now()
		if msg == lastMsg && t.Sub(last) < connectErrEvery {
			repeated++
			return
		}
		args := []any{"err", msg, "urls", urls, "same_error_since_last_warning", repeated, "per", connectErrEvery}
		hint := "nats connect attempt failed; retrying"
		if strings.Contains(msg, "tls:") || strings.Contains(msg, "x509:") || strings.Contains(msg, "tls error") {
			hint = "nats connect attempt failed on TLS; retrying: check --nats-ca (the CA that signed the server's certificate), " +
				"the server name in --nats against the certificate's names, and --nats-cert/--nats-key if the server asks for a client certificate"
		}
		log.Warn(hint, args...)
		last, lastMsg, repeated = t, msg, 0
	}
}

// EnsureStream makes sure subj's delta stream (KVMESH_DELTAS on
// kvmesh.delta.> for the default prefix) exists
// (old deltas discarded first when a limit is hit), by the rule of
// StreamConfig: absent, it is created with cfg's limits; present, only cfg's
// limits that differ from their defaults are applied, each change logged old
// → new on log (nil: slog.Default()), and everything else about the stream
// (another sidecar's limits, an operator's edits) is left as it is. Replicas
// at AutoReplicas ask for autoReplicas, take 1 where JetStream cannot place
// more (quietly on a single server, with a warning on a cluster), and never
// lower an existing stream.
func EnsureStream(ctx context.Context, js jetstream.JetStream, subj Subjects, cfg StreamConfig, log *slog.Logger) (jetstream.Stream, error) {
	s, _, err := ensureStream(ctx, js, subj, cfg, log, new(atomic.Bool))
	return s, err
}

// ensureStream is EnsureStream; short reports that cfg asked for
// AutoReplicas and the stream has fewer than autoReplicas because the
// cluster could not place them (ensureLoop asks again later). warned keeps
// the warning about that to one per connection: the caller's ensure runs
// again on every reconnect.
func ensureStream(ctx context.Context, js jetstream.JetStream, subj Subjects, cfg StreamConfig, log *slog.Logger, warned *atomic.Bool) (_ jetstream.Stream, short bool, _ error) {
	if log == nil {
		log = slog.Default()
	}
	storage := jetstream.FileStorage
	if cfg.Memory {
		storage = jetstream.MemoryStorage
	}
	auto := cfg.Replicas == AutoReplicas
	sc := jetstream.StreamConfig{
		Name:        subj.Stream(),
		Description: "kvmesh KV-cache deltas (DESIGN.md Contract 2); soft state, bounded",
		Subjects:    []string{subj.DeltaWildcard()},
		Retention:   jetstream.LimitsPolicy,
		Discard:     jetstream.DiscardOld,
		MaxAge:      cfg.MaxAge,
		MaxBytes:    cfg.MaxBytes,
		Replicas:    cfg.Replicas,
		Storage:     storage,
	}
	// cannotPlace says, once per connection, that a cluster refused the
	// replicas auto asked for.
	cannotPlace := func(have int, err error) {
		short = true
		if warned.CompareAndSwap(false, true) {
			log.Warn("the JetStream cluster cannot place the delta stream's replicas now: it runs with fewer, and the deltas it holds are lost "+
				"with its server; asked again every minute (set --stream-replicas or KVMESH_STREAM_REPLICAS to a count to insist on it)",
				"stream", subj.Stream(), "replicas", have, "wanted", autoReplicas, "err", err)
		}
	}
	for try := 0; ; try++ {
		s, err := js.Stream(ctx, subj.Stream())
		if auto {
			// After the server answered: the connection is up and its INFO
			// says whether the server is clustered.
			sc.Replicas = AutoReplicasFor(js.Conn())
		}
		if errors.Is(err, jetstream.ErrStreamNotFound) {
			s, err = js.CreateStream(ctx, sc)
			if auto && err != nil {
				single, cluster := replicasRefused(err)
				if single || cluster {
					refused := err
					sc.Replicas = 1
					if s, err = js.CreateStream(ctx, sc); err == nil && cluster {
						cannotPlace(1, refused)
					}
				}
			}
			if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) && try == 0 {
				continue // another sidecar created it meanwhile: apply the rule to its stream
			}
			if err != nil {
				return nil, false, fmt.Errorf("create stream %s: %w", subj.Stream(), storageRemedy(err, sc))
			}
			log.Info("created the delta stream", "stream", subj.Stream(), "max_age", cfg.MaxAge, "max_bytes", cfg.MaxBytes,
				"replicas", sc.Replicas, "replicas_flag", FormatReplicas(cfg.Replicas), "storage", sc.Storage)
			return s, short, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("ensure stream %s: %w", subj.Stream(), err)
		}
		cur := s.CachedInfo().Config
		next, changes := cur, []any{}
		def := DefaultConfig().Stream
		if cfg.MaxAge != def.MaxAge && cur.MaxAge != cfg.MaxAge {
			next.MaxAge = cfg.MaxAge
			changes = append(changes, "max_age", fmt.Sprintf("%v → %v", cur.MaxAge, cfg.MaxAge))
			if next.MaxAge > 0 && next.Duplicates > next.MaxAge {
				// JetStream refuses a de-duplication window longer than
				// the retention (its default is 2 min; a stream created
				// with a shorter max age got one as long as that).
				next.Duplicates = next.MaxAge
				changes = append(changes, "duplicates", fmt.Sprintf("%v → %v", cur.Duplicates, next.Duplicates))
			}
		}
		if cfg.MaxBytes != def.MaxBytes && cur.MaxBytes != cfg.MaxBytes {
			next.MaxBytes = cfg.MaxBytes
			changes = append(changes, "max_bytes", fmt.Sprintf("%d → %d", cur.MaxBytes, cfg.MaxBytes))
		}
		// Subjects that do not capture ours cannot work whatever the
		// limits (every publish waits for an ack no stream sends): ours is
		// added, the operator's others kept but those inside ours
		// ("kvmesh.delta.*"), which NATS refuses beside it as overlapping
		// and ours captures anyway. Before the replicas, whose refusal
		// below drops the last change.
		if !SubjectsCover(cur.Subjects, subj.DeltaWildcard()) {
			next.Subjects = make([]string, 0, len(cur.Subjects)+1)
			for _, s := range cur.Subjects {
				if !SubjectsCover([]string{subj.DeltaWildcard()}, s) {
					next.Subjects = append(next.Subjects, s)
				}
			}
			next.Subjects = append(next.Subjects, subj.DeltaWildcard())
			changes = append(changes, "subjects", fmt.Sprintf("%v → %v", cur.Subjects, next.Subjects))
		}
		// An explicit count is applied either way; auto only raises (an
		// operator's or another sidecar's larger count stays).
		if want := sc.Replicas; (!auto || cur.Replicas < want) && cur.Replicas != want {
			next.Replicas = want
			changes = append(changes, "replicas", fmt.Sprintf("%d → %d", cur.Replicas, want))
		}
		if next.MaxAge <= 0 && next.MaxBytes <= 0 && next.MaxMsgs <= 0 {
			// Limits at their defaults leave an operator's stream as it
			// is, also one made without any: say so, it grows for ever.
			log.Warn("the delta stream has no limits (no max age, max bytes or max messages): it keeps every delta until the NATS server's storage is full; "+
				"give it some (`nats stream edit`), or start a sidecar with --stream-max-age or --stream-max-bytes set to other than their defaults to set them",
				"stream", subj.Stream(), "storage", cur.Storage)
		}
		if len(changes) == 0 {
			return s, false, nil
		}
		up, err := js.UpdateStream(ctx, next)
		if err != nil && auto && next.Replicas != cur.Replicas {
			single, cluster := replicasRefused(err)
			if single || cluster {
				// Keep the stream's replicas and apply the rest.
				refused := err
				next.Replicas, changes = cur.Replicas, changes[:len(changes)-2]
				if cluster {
					cannotPlace(cur.Replicas, refused)
				}
				if len(changes) == 0 {
					return s, short, nil
				}
				up, err = js.UpdateStream(ctx, next)
			}
		}
		if err != nil {
			if !slices.Equal(next.Subjects, cur.Subjects) {
				return nil, false, fmt.Errorf("stream %s exists with subjects %v, which do not capture %s, so it stores no delta and every publish times out waiting for its ack; adding %s to them failed: %w "+
					"(another stream capturing part of %s must drop it first, as NATS refuses overlapping subjects; then `nats stream edit %s --subjects %s`, "+
					"or delete the stream and a sidecar creates it again)",
					subj.Stream(), cur.Subjects, subj.DeltaWildcard(), subj.DeltaWildcard(), storageRemedy(err, next), subj.DeltaWildcard(), subj.Stream(), strings.Join(next.Subjects, ","))
			}
			return nil, false, fmt.Errorf("update stream %s limits: %w", subj.Stream(), storageRemedy(err, next))
		}
		if !slices.Equal(next.Subjects, cur.Subjects) {
			log.Warn("the delta stream did not capture "+subj.DeltaWildcard()+" (it stored no delta, and every publish timed out waiting for its ack): added it to its subjects",
				"stream", subj.Stream(), "subjects", fmt.Sprintf("%v → %v", cur.Subjects, next.Subjects))
		}
		// The limits (and replicas) changed, when any did: a subjects-only
		// fix is the warning above, and no limit changed (tester h-reg8 F6).
		limits := []any{"stream", subj.Stream(), "replicas_flag", FormatReplicas(cfg.Replicas)}
		for i := 0; i+1 < len(changes); i += 2 {
			if changes[i] != "subjects" {
				limits = append(limits, changes[i], changes[i+1])
			}
		}
		if len(limits) > 4 {
			log.Info("changed the delta stream's limits to this sidecar's", limits...)
		}
		return up, short, nil
	}
}

// SubjectsCover reports whether a stream on subjects captures every
// subject that want (a literal or wildcard subject) matches: one of them is
// want itself or a wildcard matching all of it ("kvmesh.>" and
// "kvmesh.*.>" cover "kvmesh.delta.>"; "kvmesh.delta.*" does not).
func SubjectsCover(subjects []string, want string) bool {
	w := strings.Split(want, ".")
	for _, s := range subjects {
		if subjectCovers(strings.Split(s, "."), w) {
			return true
		}
	}
	return false
}

func subjectCovers(s, w []string) bool {
	for i, t := range s {
		if t == ">" {
			return i < len(w) // ">" matches one token or more
		}
		if i >= len(w) || w[i] == ">" {
			return false // w goes on (or matches more) where s ends or has one token
		}
		if t != "*" && (t != w[i] || w[i] == "*") {
			return false
		}
	}
	return len(s) == len(w)
}

// JetStream's API error codes for a stream the server has no room for.
const (
	jsInsufficientResources  = 10023 // "insufficient resources"
	jsStorageResourcesExceed = 10047 // "insufficient storage resources available"
)

// storageRemedy adds to err, when the server refused the stream sc for lack of
// storage, what to change: the stream's max_bytes (--stream-max-bytes) or the
// server's JetStream storage. Other errors are returned as they are.
func storageRemedy(err error, sc jetstream.StreamConfig) error {
	var api *jetstream.APIError
	if !errors.As(err, &api) || api.ErrorCode != jsStorageResourcesExceed && api.ErrorCode != jsInsufficientResources {
		return err
	}
	limit := "max_file_store"
	if sc.Storage == jetstream.MemoryStorage {
		limit = "max_memory_store"
	}
	return fmt.Errorf("%w (the stream asks for max_bytes=%d, %s storage: lower the sidecar's --stream-max-bytes, or raise the NATS server's JetStream %s)",
		err, sc.MaxBytes, sc.Storage, limit)
}

// openServer is the first server of urls off loopback when a connects
// with no credentials (none in a, no client certificate, none in the URL's user part), for the
// warning Connect gives; "" when every server is on loopback or a has
// credentials. A server that wants none is open to anyone who reaches it.
func openServer(urls []string, a Auth) string {
	if a.User != "" || a.Token != "" || a.NKeySeedFile != "" || a.CredsFile != "" || a.TLSCertFile != "" { // a client certificate is one (mutual TLS)
		return ""
	}
	for _, raw := range urls {
		for _, one := range strings.Split(raw, ",") {
			u, err := url.Parse(strings.TrimSpace(one))
			if err != nil || u.User != nil {
				continue
			}
			h := u.Hostname()
			if h == "" {
				continue
			}
			if ip := net.ParseIP(h); ip != nil && ip.IsLoopback() || strings.EqualFold(h, "localhost") {
				continue
			}
			return u.Host
		}
	}
	return ""
}
