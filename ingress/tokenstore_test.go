package ingress

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	natsserver "github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/internal/tokenstore"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestTokenizerFromSidecar: an ingress with no local tokenizer serves chat
// requests for a model whose sidecars published its tokenizer files to NATS,
// and tokenizes them exactly as the engine does: a conversation warmed on one
// engine, behind the ingress's back, pulls the same conversation there (its
// block keys, computed by the ingress from the fetched tokenizer and chat
// template, match the keys the engine reported).
func TestTokenizerFromSidecar(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	nt, tpl := llama(t)
	_, tplJSON := llamaFiles(t)
	modelDir := t.TempDir()
	for dst, src := range map[string]string{"tokenizer.json": filepath.Join(llamaDir, "bert-base-uncased.json"), "tokenizer_config.json": tplJSON} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(modelDir, dst), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	ns := testutil.NATS(t)

	cfg := DefaultConfig()
	cfg.ID = "ingress-tokstore"
	cfg.Scheduler.Policy = "kvmesh"
	cfg.LoadInterval = 50 * time.Millisecond
	cfg.Cluster = ClusterConfig{GossipBind: "127.0.0.1:0", GossipProfile: "local", NATSURLs: []string{ns.URL()}}
	store := NewStoreTokenizers(nil, StoreTokenizersConfig{CacheDir: t.TempDir(), Logger: quiet})
	s := startIngress(t, cfg, Deps{Tokenizers: store})
	seed := s.GossipAddr()

	const model = "meta-llama/Llama-3.1-8B-Instruct"
	sims := map[string]*sim.Server{}
	for i, id := range []string{"eng-a", "eng-b"} {
		sm, err := sim.Start(context.Background(), sim.Config{Model: model, KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
			Engine: engine.Config{BlockSize: 16, GPUBlocks: 2048, Profile: mustProfile(t, "tiny")}, TimeScale: 500, Seed: uint64(i + 1),
			Tokenizer: nt, Chat: sim.TemplateChat{T: tpl}, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		sims[id] = sm
		startSidecar(t, sidecar.EngineConfig{ID: id, Model: model, URL: sm.URL(), DPSize: 1,
			RankEvents: sm.EventsEndpoints(), RankReplay: sm.ReplayEndpoints(), TokenizerDir: modelDir}, ns.URL(), seed, quiet)
	}
	base := "http://" + s.Addr()
	// Hang guards: on a loaded machine the tokenizer's fetch, its load under
	// the race detector and the retries' backoff take tens of seconds.
	testutil.WaitFor(t, time.Minute, "ingress ready with both engines known by gossip and healthy (their sidecars report ready)", func() bool {
		st, _, _ := get(base + "/ready")
		return st == 200 && healthyEngines(s) == 2
	})
	testutil.WaitFor(t, 2*time.Minute, "the published tokenizer loaded by the ingress", func() bool {
		_, ok := store.For(model)
		return ok
	})

	system := strings.Repeat("You are a careful assistant who answers in full sentences and cites sources. ", 40)
	chat := `{"model":"` + model + `","messages":[{"role":"system","content":"` + system + `"},{"role":"user","content":"What is a KV cache?"}],"max_tokens":2}`
	if st, _, b := post(t, http.DefaultClient, sims["eng-a"].URL()+"/v1/chat/completions", chat); st != 200 {
		t.Fatalf("warm eng-a: %d %s", st, b)
	}
	testutil.WaitFor(t, time.Minute, "eng-a's warmed conversation in the ingress index", func() bool {
		return s.deps.Index.KeyCount("eng-a", kvevents.TierGPU) >= 20
	})
	for i := 0; i < 6; i++ {
		st, hdr, b := post(t, http.DefaultClient, base+"/v1/chat/completions", chat)
		if st != 200 {
			t.Fatalf("chat %d via the ingress: %d %s", i, st, b)
		}
		if e := hdr.Get("X-Kvmesh-Engine"); e != "eng-a" {
			t.Fatalf("chat %d went to %q: the ingress's keys for the conversation do not match the engine's", i, e)
		}
	}
	if _, ok := store.For("no/such-model"); ok {
		t.Fatal("a model nobody published has a tokenizer")
	}
}

func mustProfile(t *testing.T, name string) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// A published tokenizer that does not load (here a model type the native
// tokenizer lacks) is tried once per MissRetry, not by every request: the
// requests meanwhile get no tokenizer at once.
func TestStoreTokenizerLoadFailureWaits(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	nc, bucket := tokenBucket(ctx, t)
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(`{"model":{"type":"NoSuchModel"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	const model = "broken/model"
	if _, _, err := tokenstore.Publish(ctx, bucket, model, "", dir); err != nil {
		t.Fatal(err)
	}
	var loads atomic.Int32
	store := NewStoreTokenizers(nil, StoreTokenizersConfig{CacheDir: t.TempDir(), MissRetry: time.Hour, Logger: quietLog(),
		Load: func(model, dir string) (Tokenizer, error) {
			loads.Add(1)
			return loadTokenizerDir(model, dir)
		}})
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx, nc) }()
	defer func() { cancel(); <-done }()
	testutil.WaitFor(t, 10*time.Second, "the store's first load attempt", func() bool {
		_, _ = store.For(model)
		return loads.Load() > 0
	})
	for i := 0; i < 50; i++ {
		if _, ok := store.For(model); ok {
			t.Fatal("a tokenizer that does not load was returned")
		}
	}
	if n := loads.Load(); n > 2 { // the first request's and, racing it, the watch's
		t.Fatalf("%d load attempts for 50 requests within the retry time", n)
	}
}

// An ingress with a --nats-prefix reads its installation's tokenizer store
// only: a model published under the same name in the default one is not
// its.
func TestStoreTokenizersReadTheirPrefixsStore(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ns := testutil.NATS(t)
	ncfg := natsutil.DefaultConfig()
	ncfg.URLs, ncfg.Prefix = []string{ns.URL()}, "team-a"
	nc, err := natsutil.Connect(ctx, ncfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc.NC)
	if err != nil {
		t.Fatal(err)
	}
	llamaFiles(t)
	dir := t.TempDir()
	b, err := os.ReadFile(filepath.Join(llamaDir, "bert-base-uncased.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	for bucket, model := range map[string]string{tokenstore.Bucket: "other/model", "TEAM-A_TOKENIZERS": "ours/model"} {
		store, err := tokenstore.EnsureBucket(ctx, js, bucket, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := tokenstore.Publish(ctx, store, model, "", dir); err != nil {
			t.Fatal(err)
		}
	}
	store := NewStoreTokenizers(nil, StoreTokenizersConfig{CacheDir: t.TempDir(), MissRetry: time.Hour, Logger: quietLog()})
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx, nc) }()
	defer func() { cancel(); <-done }()
	testutil.WaitFor(t, 10*time.Second, "its own installation's tokenizer", func() bool {
		_, ok := store.For("ours/model")
		return ok
	})
	if _, ok := store.For("other/model"); ok {
		t.Fatal("the default installation's tokenizer was read by a team-a ingress")
	}
}

// A request never waits on NATS for a tokenizer refresh (docs/RELIABILITY.md:
// routing never waits for NATS). A model known to be missing whose retry time
// has passed is fetched again in the background: the lookup answers "none"
// while that fetch is provably still blocked (JetStream's API is answered by
// a subscriber that never replies until the test ends). Before, the lookup
// ran the fetch itself and waited up to FetchTimeout, and so did every
// concurrent request for that model.
func TestStoreTokenizerRefreshDoesNotBlockRequests(t *testing.T) {
	srv := testutil.NATSServer(t, natsserver.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ncfg := natsutil.DefaultConfig()
	ncfg.URLs = []string{srv.ClientURL()}
	ncfg.Stream.Disabled = true // this server has no JetStream
	conn, err := natsutil.Connect(ctx, ncfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	nc := conn.NC

	const model = "unpublished/model"
	store := NewStoreTokenizers(nil, StoreTokenizersConfig{CacheDir: t.TempDir(), Logger: quietLog(),
		FetchTimeout: time.Hour, MissRetry: time.Millisecond, FirstWait: time.Hour})
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx, conn) }()
	defer func() { cancel(); <-done }()

	// No JetStream and no hanging responder yet: the first lookup's fetch
	// fails at once (no responders) and the model is known to be missing.
	testutil.WaitFor(t, 10*time.Second, "the first lookup answered (the model known to be missing)", func() bool {
		if store.js.Load() == nil {
			return false
		}
		if _, ok := store.For(model); ok {
			return false
		}
		// Answered after its fetch, not before one started (a lookup
		// before the connection's handler ran answers "none" without one,
		// and the refresh below would then be the first lookup's, which
		// waits FirstWait).
		store.mu.Lock()
		defer store.mu.Unlock()
		_, known := store.missed[model]
		_, loading := store.loading[model]
		return known && !loading
	})

	// From now on JetStream's API swallows every request without a reply.
	hit := make(chan struct{}, 1)
	hang, err := nc.Subscribe("$JS.API.>", func(*nats.Msg) {
		select {
		case hit <- struct{}{}:
		default:
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer hang.Unsubscribe()
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the model's retry time passed", func() bool {
		store.mu.Lock()
		defer store.mu.Unlock()
		return time.Now().After(store.missed[model])
	})

	lookups := func(n int) {
		t.Helper()
		got := make(chan bool, n)
		for i := 0; i < n; i++ {
			go func() { _, ok := store.For(model); got <- ok }()
		}
		for i := 0; i < n; i++ {
			select {
			case ok := <-got:
				if ok {
					t.Fatal("a tokenizer for a model nobody published")
				}
			case <-time.After(30 * time.Second):
				t.Fatal("a lookup after the retry time waited on the NATS round trip of a refresh")
			}
		}
	}
	lookups(8)
	// The refresh was started (its JetStream request reached the swallowing
	// subscriber) and is still blocked: it has no reply and an hour to wait.
	select {
	case <-hit:
	case <-time.After(30 * time.Second):
		t.Fatal("no refresh was started after the retry time")
	}
	store.mu.Lock()
	_, inFlight := store.loading[model]
	store.mu.Unlock()
	if !inFlight {
		t.Fatal("the refresh is not in flight")
	}
	lookups(8) // the refresh still blocked: answered at once, no second fetch
}

// While the NATS connection is down no fetch starts: the lookup answers with
// what is known.
func TestStoreTokenizerSkipsFetchWhileDisconnected(t *testing.T) {
	ns := testutil.NATS(t)
	gate := testutil.NewGate(t)
	gate.Open(strings.TrimPrefix(ns.URL(), "nats://"))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ncfg := natsutil.DefaultConfig()
	ncfg.URLs = []string{"nats://" + gate.Addr()}
	nc, err := natsutil.Connect(ctx, ncfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	store := NewStoreTokenizers(nil, StoreTokenizersConfig{CacheDir: t.TempDir(), Logger: quietLog(), FetchTimeout: time.Hour, FirstWait: time.Hour})
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx, nc) }()
	defer func() { cancel(); <-done }()
	testutil.WaitFor(t, 10*time.Second, "the store running", func() bool { return store.js.Load() != nil })
	gate.Shut()
	// Connected, what For reads: the disconnect handler runs shortly after
	// nats.go has marked the connection down.
	testutil.WaitFor(t, 10*time.Second, "the connection down", func() bool { return !nc.Connected() })
	got := make(chan bool, 1)
	go func() { _, ok := store.For("never/seen"); got <- ok }()
	select {
	case ok := <-got:
		if ok {
			t.Fatal("a tokenizer for a model nobody published")
		}
	case <-time.After(30 * time.Second):
		t.Fatal("a lookup while NATS is down waited for a fetch")
	}
	store.mu.Lock()
	n := len(store.loading)
	store.mu.Unlock()
	if n != 0 {
		t.Fatal("a fetch was started while NATS is down")
	}
}

// silentServer accepts TCP connections and never answers (what a SIGSTOPped
// NATS server looks like to a client: the kernel completes the handshake,
// nothing sends INFO). It holds every connection until release.
type silentServer struct {
	ln       net.Listener
	accepted atomic.Int32
	mu       sync.Mutex
	conns    []net.Conn
	once     sync.Once
	done     chan struct{}
}

func newSilentServer(t *testing.T) *silentServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &silentServer{ln: ln, done: make(chan struct{})}
	go func() { // owned by s: ends when release closes the listener
		defer close(s.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			s.mu.Lock()
			s.conns = append(s.conns, c)
			s.mu.Unlock()
			s.accepted.Add(1)
		}
	}()
	t.Cleanup(s.release)
	return s
}

// release closes the listener and every connection it accepted.
func (s *silentServer) release() {
	s.once.Do(func() {
		s.ln.Close()
		<-s.done
		s.mu.Lock()
		for _, c := range s.conns {
			c.Close()
		}
		s.mu.Unlock()
	})
}

// A hung NATS server (TCP accepted, never answered) does not stall the
// request path: nats.go's reconnect loop holds the connection's lock
// through each connect attempt, a dial and the wait for INFO (ConnectTimeout,
// here an hour so the attempt lasts until the test lets go), and For used to
// wait for that lock in nats.Conn.IsConnected. The lookups run while the
// attempt is provably in progress (the silent server has accepted the
// client's connection and holds it; a probe calling nc.IsConnected stays
// blocked) and must all answer before the server lets go.
func TestStoreTokenizerForDuringHungReconnect(t *testing.T) {
	ns := testutil.NATS(t)
	gate := testutil.NewGate(t)
	gate.Open(strings.TrimPrefix(ns.URL(), "nats://"))
	silent := newSilentServer(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ncfg := natsutil.DefaultConfig()
	ncfg.URLs = []string{"nats://" + gate.Addr()}
	ncfg.Stream.Disabled = true
	ncfg.ConnectTimeout = time.Hour
	ncfg.ReconnectWait = 10 * time.Millisecond
	nc, err := natsutil.Connect(ctx, ncfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	store := NewStoreTokenizers(nil, StoreTokenizersConfig{CacheDir: t.TempDir(), Logger: quietLog(),
		MissRetry: time.Hour, FirstWait: 10 * time.Second})
	done := make(chan struct{})
	go func() { defer close(done); store.Run(ctx, nc) }()
	// Deferred after nc.Close, so run before it: the attempt holds the
	// connection's lock until the silent server lets go, and Close and
	// Run's end need that lock.
	defer func() { silent.release(); cancel(); <-done }()

	// Connected, with one model known to be missing (nobody published it).
	const known = "known/missing"
	testutil.WaitFor(t, 10*time.Second, "the model known to be missing", func() bool {
		if !nc.Connected() {
			return false
		}
		_, _ = store.For(known)
		store.mu.Lock()
		defer store.mu.Unlock()
		_, loading := store.loading[known]
		return !loading && time.Now().Before(store.missed[known])
	})

	// NATS goes away and what answers at its address from now on is hung.
	gate.Shut()
	gate.Open(silent.ln.Addr().String())
	testutil.WaitFor(t, 10*time.Second, "the reconnect's connect attempt held by the hung server", func() bool {
		return silent.accepted.Load() > 0
	})
	probe := make(chan struct{})
	go func() { _ = nc.NC.IsConnected(); close(probe) }() // ends when the silent server lets go

	got := make(chan bool, 2)
	go func() { _, ok := store.For(known); got <- ok }()
	go func() { _, ok := store.For("never/seen"); got <- ok }()
	for i := 0; i < 2; i++ {
		var ok bool
		testutil.WaitFor(t, 20*time.Second, "a lookup while the reconnect waits on a hung server", func() bool {
			select {
			case ok = <-got:
				return true
			default:
				return false
			}
		})
		if ok {
			t.Fatal("a tokenizer for a model nobody published")
		}
	}
	select {
	case <-probe:
		t.Fatal("the connection's lock was free: the test did not hold a connect attempt")
	default:
	}
	if nc.Connected() {
		t.Fatal("Connected says up while reconnecting")
	}
}

// tokenBucket is a NATS connection (closed when the test ends) to an
// embedded server with the tokenizer store's bucket.
func tokenBucket(ctx context.Context, t *testing.T) (*natsutil.Conn, jetstream.ObjectStore) {
	t.Helper()
	ns := testutil.NATS(t)
	ncfg := natsutil.DefaultConfig()
	ncfg.URLs = []string{ns.URL()}
	nc, err := natsutil.Connect(ctx, ncfg, quietLog())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc.NC)
	if err != nil {
		t.Fatal(err)
	}
	bucket, err := tokenstore.EnsureBucket(ctx, js, tokenstore.Bucket, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	return nc, bucket
}
