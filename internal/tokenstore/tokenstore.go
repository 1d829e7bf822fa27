// Package tokenstore delivers each model's tokenizer files from the engines to
// the ingresses through a NATS JetStream object store, so an ingress needs no
// ConfigMap (Llama 3's tokenizer.json alone is 9 MB; a ConfigMap holds 1 MiB).
//
// The sidecar shares the engine pod and its model files: it publishes the
// model's tokenizer.json and tokenizer_config.json (Publish) under the model
// and a revision, with a SHA-256 digest per file and a manifest naming the
// current revision. Ingresses only read (Reader): they fetch a model's files on
// first use, verify every digest, and watch the manifests to reload on change.
//
// Layout of the bucket (object names):
//
//	manifests/<model>                 JSON Manifest: revision and file digests
//	files/<model>@<revision>/<file>   the file's bytes
//
// The sidecar creates the bucket (it owns the mesh's JetStream assets, as it
// owns the delta stream); an ingress never creates or alters it.
package tokenstore

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// Bucket is the default installation's object store name
// (natsutil.Subjects.TokenizerBucket of the prefix "kvmesh").
const Bucket = "KVMESH_TOKENIZERS"

// Files are the files published per model, in this order; tokenizer.json is
// required, the others are published when present.
var Files = []string{"tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json"}

// MaxFileBytes bounds one published file (the largest tokenizers are ~20 MB).
const MaxFileBytes = 64 << 20

var (
	// ErrNotFound: no tokenizer is published for the model.
	ErrNotFound = errors.New("tokenizer not published")
	// ErrDigest: a fetched file does not match its manifest's digest.
	ErrDigest = errors.New("tokenizer digest mismatch")
	// ErrManifest: a manifest is malformed.
	ErrManifest = errors.New("malformed tokenizer manifest")
)

// Manifest names a model's current tokenizer revision and its files' digests.
type Manifest struct {
	Model    string `json:"model"`
	Revision string `json:"revision"`
	// Files maps a file name (one of Files) to "sha256:<hex>".
	Files     map[string]string `json:"files"`
	Published time.Time         `json:"published"`
}

// Validate checks a decoded manifest.
func (m *Manifest) Validate() error {
	if m.Model == "" || m.Revision == "" {
		return fmt.Errorf("%w: model and revision are required", ErrManifest)
	}
	if _, ok := m.Files["tokenizer.json"]; !ok {
		return fmt.Errorf("%w: no tokenizer.json", ErrManifest)
	}
	for name, d := range m.Files {
		if !known(name) {
			return fmt.Errorf("%w: unknown file %q", ErrManifest, name)
		}
		if !strings.HasPrefix(d, "sha256:") || len(d) != len("sha256:")+64 {
			return fmt.Errorf("%w: digest of %s: %q", ErrManifest, name, d)
		}
	}
	return nil
}

// DecodeManifest parses and validates a manifest.
func DecodeManifest(b []byte) (Manifest, error) {
	var m Manifest
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&m); err != nil {
		return Manifest{}, fmt.Errorf("%w: %v", ErrManifest, err)
	}
	if err := m.Validate(); err != nil {
		return Manifest{}, err
	}
	return m, nil
}

func known(name string) bool {
	for _, f := range Files {
		if f == name {
			return true
		}
	}
	return false
}

func manifestName(model string) string { return "manifests/" + model }
func fileName(model, rev, file string) string {
	return "files/" + model + "@" + rev + "/" + file
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

// EnsureBucket creates the object store when missing (the sidecar's job)
// with replicas by the delta stream's rule (natsutil.StreamConfig.Replicas):
// natsutil.AutoReplicas asks for 3 and takes 1 where JetStream cannot place
// 3; an existing store is raised to the count asked for (auto: only raised,
// and left as it is where the cluster cannot place more), so an install
// that began on one replica gets its copies at the sidecar's next start.
func EnsureBucket(ctx context.Context, js jetstream.JetStream, bucket string, replicas int, memory bool) (jetstream.ObjectStore, error) {
	auto := replicas == natsutil.AutoReplicas
	os, err := js.ObjectStore(ctx, bucket)
	want := replicas
	if auto {
		// Read after the server answered: a sidecar started before NATS
		// calls this while its connection is still coming up.
		want = natsutil.AutoReplicasFor(js.Conn())
	}
	if err == nil {
		return os, raiseReplicas(ctx, js, bucket, want, auto)
	}
	if !errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("open %s: %w", bucket, err)
	}
	storage := jetstream.FileStorage
	if memory {
		storage = jetstream.MemoryStorage
	}
	cfg := jetstream.ObjectStoreConfig{
		Bucket:      bucket,
		Description: "kvmesh: tokenizer files per model, published by the sidecars",
		Storage:     storage,
		Replicas:    want,
	}
	os, err = js.CreateOrUpdateObjectStore(ctx, cfg)
	if single, cluster := natsutil.ReplicasRefused(err); auto && (single || cluster) {
		cfg.Replicas = 1
		os, err = js.CreateOrUpdateObjectStore(ctx, cfg)
	}
	if err != nil {
		return nil, fmt.Errorf("create %s: %w", bucket, err)
	}
	return os, nil
}

// raiseReplicas sets the object store's stream to want replicas when it
// has another count (auto: fewer), and keeps its count where auto's are
// refused (a single server, a cluster short of servers).
func raiseReplicas(ctx context.Context, js jetstream.JetStream, bucket string, want int, auto bool) error {
	s, err := js.Stream(ctx, "OBJ_"+bucket)
	if err != nil {
		return fmt.Errorf("open %s: %w", bucket, err)
	}
	sc := s.CachedInfo().Config
	if sc.Replicas == want || auto && sc.Replicas > want {
		return nil
	}
	sc.Replicas = want
	_, err = js.UpdateStream(ctx, sc)
	if single, cluster := natsutil.ReplicasRefused(err); auto && (single || cluster) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("set %s replicas to %d: %w", bucket, want, err)
	}
	return nil
}

// Publish puts the tokenizer files of dir under model and revision (an empty
// revision is derived from the files' digests) and then points the model's
// manifest at them. It writes nothing when the manifest already names the same
// digests, so every sidecar of a model may call it at start. changed reports
// whether a new revision was published.
func Publish(ctx context.Context, store jetstream.ObjectStore, model, revision, dir string) (m Manifest, changed bool, err error) {
	return PublishLimited(ctx, store, model, revision, dir, 0)
}

// PublishLimited is Publish for a NATS server whose max_payload is
// maxPayload bytes (0: unknown, the object store's 128 KiB chunks): files
// are stored in chunks that fit it, where 128 KiB chunks would fail with
// "maximum payload exceeded" (a 64 KiB max_payload).
func PublishLimited(ctx context.Context, store jetstream.ObjectStore, model, revision, dir string, maxPayload int64) (m Manifest, changed bool, err error) {
	if model == "" {
		return Manifest{}, false, errors.New("publish tokenizer: empty model")
	}
	data := map[string][]byte{}
	m = Manifest{Model: model, Files: map[string]string{}}
	for _, f := range Files {
		b, err := readBounded(filepath.Join(dir, f))
		if errors.Is(err, fs.ErrNotExist) && f != "tokenizer.json" {
			continue
		}
		if err != nil {
			return Manifest{}, false, fmt.Errorf("publish tokenizer %s: %w", model, err)
		}
		data[f] = b
		m.Files[f] = digest(b)
	}
	if revision == "" {
		revision = revisionOf(m.Files)
	}
	m.Revision = revision
	if cur, err := current(ctx, store, model); err == nil && sameFiles(cur, m) {
		return cur, false, nil
	}
	for _, f := range Files {
		b, ok := data[f]
		if !ok {
			continue
		}
		meta := jetstream.ObjectMeta{Name: fileName(model, revision, f), Opts: &jetstream.ObjectMetaOptions{ChunkSize: chunkSize(maxPayload)}}
		if _, err := store.Put(ctx, meta, bytes.NewReader(b)); err != nil {
			return Manifest{}, false, fmt.Errorf("publish tokenizer %s: put %s: %w", model, f, err)
		}
	}
	m.Published = time.Now().UTC()
	mb, err := json.Marshal(m)
	if err != nil {
		return Manifest{}, false, err
	}
	if _, err := store.PutBytes(ctx, manifestName(model), mb); err != nil {
		return Manifest{}, false, fmt.Errorf("publish tokenizer %s: manifest: %w", model, err)
	}
	return m, true, nil
}

// chunkHeadroom is what a chunk leaves of max_payload for the message's
// headers (an object chunk carries none today).
const chunkHeadroom = 1 << 10

// chunkSize is the object chunk size for a server's max_payload: 0 (the
// object store's default, 128 KiB) when that fits or the limit is unknown.
func chunkSize(maxPayload int64) uint32 {
	const dflt = 128 << 10
	if maxPayload <= 0 || maxPayload >= dflt+chunkHeadroom {
		return 0
	}
	return uint32(max(maxPayload-chunkHeadroom, 1<<10))
}

// revisionOf names content by its digests (stable across sidecars of a model).
func revisionOf(files map[string]string) string {
	h := sha256.New()
	for _, f := range Files {
		if d, ok := files[f]; ok {
			h.Write([]byte(f + "=" + d + "\n"))
		}
	}
	return "sha256-" + hex.EncodeToString(h.Sum(nil))[:16]
}

func sameFiles(a, b Manifest) bool {
	if a.Revision != b.Revision || len(a.Files) != len(b.Files) {
		return false
	}
	for k, v := range a.Files {
		if b.Files[k] != v {
			return false
		}
	}
	return true
}

func readBounded(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, err
	}
	if st.Size() > MaxFileBytes {
		return nil, fmt.Errorf("%s: %d bytes, over %d", path, st.Size(), MaxFileBytes)
	}
	return os.ReadFile(path)
}

func current(ctx context.Context, store jetstream.ObjectStore, model string) (Manifest, error) {
	b, err := store.GetBytes(ctx, manifestName(model))
	if errors.Is(err, jetstream.ErrObjectNotFound) {
		return Manifest{}, fmt.Errorf("%w: %s", ErrNotFound, model)
	}
	if err != nil {
		return Manifest{}, err
	}
	m, err := DecodeManifest(b)
	if err != nil {
		return Manifest{}, err
	}
	if m.Model != model {
		return Manifest{}, fmt.Errorf("%w: manifest of %q names %q", ErrManifest, model, m.Model)
	}
	return m, nil
}
