package tokenstore

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func jsFor(t *testing.T) jetstream.JetStream {
	t.Helper()
	srv := testutil.NATS(t)
	_, js := testutil.JetStream(t, srv.URL())
	return js
}

func writeModel(t *testing.T, tok, cfg string) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), []byte(tok), 0o644); err != nil {
		t.Fatal(err)
	}
	if cfg != "" {
		if err := os.WriteFile(filepath.Join(dir, "tokenizer_config.json"), []byte(cfg), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestPublishFetchAndRepublish(t *testing.T) {
	ctx := ctxT(t)
	js := jsFor(t)
	if _, err := OpenReader(ctx, js, Bucket, t.TempDir()); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("reader before any sidecar published: err = %v, want ErrBucketNotFound (readers never create the bucket)", err)
	}
	store, err := EnsureBucket(ctx, js, Bucket, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	model := "meta-llama/Llama-3.1-8B-Instruct"
	src := writeModel(t, `{"model":{"type":"BPE"}}`, `{"chat_template":"{{ x }}"}`)
	m1, changed, err := Publish(ctx, store, model, "", src)
	if err != nil || !changed {
		t.Fatalf("first publish: changed=%v err=%v", changed, err)
	}
	if len(m1.Files) != 2 || m1.Revision == "" {
		t.Fatalf("manifest %+v: want two files and a derived revision", m1)
	}
	// A second sidecar of the same model publishes the same files: nothing is written.
	if _, changed, err := Publish(ctx, store, model, "", writeModel(t, `{"model":{"type":"BPE"}}`, `{"chat_template":"{{ x }}"}`)); err != nil || changed {
		t.Fatalf("republish of identical files: changed=%v err=%v, want unchanged", changed, err)
	}

	r, err := OpenReader(ctx, js, Bucket, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir, got, err := r.Fetch(ctx, model)
	if err != nil {
		t.Fatal(err)
	}
	if got.Revision != m1.Revision {
		t.Fatalf("fetched revision %s, published %s", got.Revision, m1.Revision)
	}
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		want, _ := os.ReadFile(filepath.Join(src, f))
		have, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil || string(have) != string(want) {
			t.Fatalf("%s: fetched %q (%v), published %q", f, have, err, want)
		}
	}

	// New files: a new revision, fetched into a directory of its own.
	m2, changed, err := Publish(ctx, store, model, "v2", writeModel(t, `{"model":{"type":"Unigram"}}`, ""))
	if err != nil || !changed || m2.Revision != "v2" || len(m2.Files) != 1 {
		t.Fatalf("publish v2: %+v changed=%v err=%v", m2, changed, err)
	}
	dir2, got2, err := r.Fetch(ctx, model)
	if err != nil || got2.Revision != "v2" || dir2 == dir {
		t.Fatalf("fetch after v2: dir %s (was %s) rev %s err %v", dir2, dir, got2.Revision, err)
	}
	if _, err := os.Stat(filepath.Join(dir2, "tokenizer_config.json")); !os.IsNotExist(err) {
		t.Fatalf("v2 has no tokenizer_config.json, but the fetched directory does (err %v)", err)
	}

	if _, _, err := r.Fetch(ctx, "no/such-model"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unpublished model: err = %v, want ErrNotFound", err)
	}
}

func TestFetchRejectsCorruptFile(t *testing.T) {
	ctx := ctxT(t)
	js := jsFor(t)
	store, err := EnsureBucket(ctx, js, Bucket, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	m, _, err := Publish(ctx, store, "m", "r1", writeModel(t, "good", ""))
	if err != nil {
		t.Fatal(err)
	}
	// Overwrite the file behind the manifest's back.
	if _, err := store.PutBytes(ctx, fileName("m", m.Revision, "tokenizer.json"), []byte("evil")); err != nil {
		t.Fatal(err)
	}
	r, err := OpenReader(ctx, js, Bucket, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Fetch(ctx, "m"); !errors.Is(err, ErrDigest) {
		t.Fatalf("corrupt file: err = %v, want ErrDigest", err)
	}
	// A malformed manifest is rejected, not followed.
	if _, err := store.PutBytes(ctx, manifestName("m"), []byte(`{"model":"m","revision":"r1","files":{"../../etc/passwd":"x"}}`)); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.Fetch(ctx, "m"); !errors.Is(err, ErrManifest) {
		t.Fatalf("malformed manifest: err = %v, want ErrManifest", err)
	}
}

func TestWatchSeesExistingAndNewManifests(t *testing.T) {
	ctx := ctxT(t)
	js := jsFor(t)
	store, err := EnsureBucket(ctx, js, Bucket, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := Publish(ctx, store, "a", "1", writeModel(t, "a", "")); err != nil {
		t.Fatal(err)
	}
	r, err := OpenReader(ctx, js, Bucket, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	seen := make(chan string, 16)
	wctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Watch(wctx, func(m string) { seen <- m }) }()
	want := func(model string) {
		t.Helper()
		select {
		case m := <-seen:
			if m != model {
				t.Fatalf("watch saw %q, want %q", m, model)
			}
		case <-time.After(20 * time.Second):
			t.Fatalf("watch did not report %q", model)
		}
	}
	want("a")
	if _, _, err := Publish(ctx, store, "b/c", "1", writeModel(t, "b", "")); err != nil {
		t.Fatal(err)
	}
	want("b/c")
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("watch: %v", err)
	}
}

func FuzzDecodeManifest(f *testing.F) {
	f.Add([]byte(`{"model":"m","revision":"r","files":{"tokenizer.json":"sha256:0000000000000000000000000000000000000000000000000000000000000000"}}`))
	f.Add([]byte(`{"model":"","revision":"r","files":{}}`))
	f.Add([]byte(`{"model":"m","revision":"r","files":{"x":"y"},"extra":1}`))
	f.Add([]byte(`[]`))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := DecodeManifest(b)
		if err != nil {
			if !errors.Is(err, ErrManifest) {
				t.Fatalf("error %v does not wrap ErrManifest", err)
			}
			return
		}
		if m.Validate() != nil {
			t.Fatal("decoded manifest does not validate")
		}
		for name := range m.Files {
			if filepath.Base(name) != name {
				t.Fatalf("file name %q escapes its directory", name)
			}
		}
	})
}

// TestPublishUnderSmallMaxPayload: with a NATS max_payload of 64 KiB, below
// the object store's default 128 KiB chunk, a 300 KB tokenizer.json is
// published (in chunks that fit) and read back whole. Before, every publish
// failed with "maximum payload exceeded".
func TestPublishUnderSmallMaxPayload(t *testing.T) {
	ctx := ctxT(t)
	srv := testutil.NATSServer(t, server.Options{JetStream: true, MaxPayload: 64 << 10})
	nc, js := testutil.JetStream(t, srv.ClientURL())
	store, err := EnsureBucket(ctx, js, Bucket, 1, true)
	if err != nil {
		t.Fatal(err)
	}
	tok := `{"model":{"type":"BPE","pad":"` + strings.Repeat("x", 300<<10) + `"}}`
	if _, _, err := PublishLimited(ctx, store, "m", "", writeModel(t, tok, ""), nc.MaxPayload()); err != nil {
		t.Fatal(err)
	}
	r, err := OpenReader(ctx, js, Bucket, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	dir, _, err := r.Fetch(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dir, "tokenizer.json")); err != nil || string(got) != tok {
		t.Fatalf("read back %d bytes (err %v), want %d", len(got), err, len(tok))
	}
}

// On a three-server cluster the sidecar's default (auto) replicas give the
// tokenizer store 3 copies, and raise a store an older install made with 1,
// so an ingress starting while a NATS server is down still finds the files.
func TestEnsureBucketAutoReplicasOnCluster(t *testing.T) {
	srvs := testutil.NATSCluster(t, 3)
	_, js := testutil.JetStream(t, testutil.ClientURLs(srvs))
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	replicas := func() int { return testutil.StreamReplicas(ctx, t, js, "OBJ_"+Bucket) }
	ensure := func(replicas int) {
		t.Helper()
		if err := testutil.RetryLost(ctx, func(ctx context.Context) error {
			_, err := EnsureBucket(ctx, js, Bucket, replicas, true)
			return err
		}); err != nil {
			t.Fatal(err)
		}
	}
	ensure(1)
	if n := replicas(); n != 1 {
		t.Fatalf("explicit 1: %d replicas", n)
	}
	ensure(natsutil.AutoReplicas)
	if n := replicas(); n != 3 {
		t.Fatalf("auto left the store at %d replicas, want 3", n)
	}
}

// On the README's NATS (Debian's nats-server 2.9, one server, not
// clustered) auto replicas keep the bucket at 1, also for a sidecar whose
// connection is still coming up when it ensures the bucket (it may start
// before NATS): 2.9 accepts raising an existing bucket to 3 there, so the
// count is read once the server has answered, not before.
func TestEnsureBucketAutoReplicasDebianNATS(t *testing.T) {
	testutil.RequireTool(t, "nats-server", "the README's install path is Debian's nats-server")
	dir := t.TempDir()
	url, stop := testutil.SystemNATS(t, dir, 0)
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	replicas := func() int { return testutil.StreamReplicas(ctx, t, js, "OBJ_"+Bucket) }
	if _, err := EnsureBucket(ctx, js, Bucket, natsutil.AutoReplicas, false); err != nil {
		t.Fatal(err)
	}
	if n := replicas(); n != 1 {
		t.Fatalf("created with %d replicas on a single server, want 1", n)
	}

	// The server goes away; the bucket is ensured while the connection is
	// down, and the server comes back (same port, same store).
	port := nc.ConnectedAddr()[strings.LastIndexByte(nc.ConnectedAddr(), ':')+1:]
	stop()
	testutil.WaitFor(t, 30*time.Second, "the connection down", func() bool { return !nc.IsConnected() })
	done := make(chan error, 1)
	go func() { _, err := EnsureBucket(ctx, js, Bucket, natsutil.AutoReplicas, false); done <- err }()
	p, _ := strconv.Atoi(port)
	testutil.SystemNATS(t, dir, p)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := replicas(); n != 1 {
		t.Fatalf("ensured again across a reconnect: %d replicas on a single server, want 1", n)
	}
}
