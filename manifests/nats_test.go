package manifests

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/internal/tokenstore"
)

// natsConf returns the nats.conf of base/nats.yaml's ConfigMap.
func natsConf(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("base", "nats.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytesReader(b))
	for {
		var doc struct {
			Kind string            `yaml:"kind"`
			Data map[string]string `yaml:"data"`
		}
		if err := dec.Decode(&doc); err != nil {
			t.Fatalf("no ConfigMap with nats.conf in base/nats.yaml: %v", err)
		}
		if doc.Kind == "ConfigMap" && doc.Data["nats.conf"] != "" {
			return doc.Data["nats.conf"]
		}
	}
}

// startManifestNATS runs nats-server with the manifest's own configuration
// (accounts, users, permissions), as one server on a loopback port: the
// cluster block and the monitoring port are what a test cannot use.
func startManifestNATS(t *testing.T) string {
	t.Helper()
	conf := natsConf(t)
	conf = regexp.MustCompile(`(?s)\ncluster \{.*?\n\}\n`).ReplaceAllString(conf, "\n")
	conf = regexp.MustCompile(`store_dir: \S+`).ReplaceAllString(conf, "store_dir: "+filepath.ToSlash(t.TempDir()))
	dir := t.TempDir()
	path := filepath.Join(dir, "nats.conf")
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	for k, v := range map[string]string{"SERVER_NAME": "nats-0", "SIDECAR_PASSWORD": "sidecar-pw", "INGRESS_PASSWORD": "ingress-pw",
		"ADMIN_PASSWORD": "admin-pw", "SYS_PASSWORD": "sys-pw"} {
		t.Setenv(k, v)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("the manifest's nats.conf does not parse: %v", err)
	}
	if opts.Cluster.Port != 0 || len(opts.Routes) != 0 {
		t.Fatalf("cluster block not removed for the single test server")
	}
	opts.HTTPPort = 0
	return testutil.NATSServer(t, *opts).ClientURL()
}

func jsAs(t *testing.T, url, user, pw string) jetstream.JetStream {
	t.Helper()
	nc, err := nats.Connect(url, nats.UserInfo(user, pw))
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// TestNATSUsersHaveTheirRolesRights: with the manifest's NATS configuration, the
// sidecar user creates the delta stream and publishes a tokenizer; the ingress
// user reads and watches the tokenizer but can neither create nor alter the
// stream nor write to the tokenizer store.
func TestNATSUsersHaveTheirRolesRights(t *testing.T) {
	url := startManifestNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	side := jsAs(t, url, "sidecar", "sidecar-pw")
	if _, err := natsutil.EnsureStream(ctx, side, natsutil.Default(), natsutil.DefaultConfig().Stream, nil); err != nil {
		t.Fatalf("sidecar creates the delta stream: %v", err)
	}
	store, err := tokenstore.EnsureBucket(ctx, side, tokenstore.Bucket, 1, false)
	if err != nil {
		t.Fatalf("sidecar creates the tokenizer store: %v", err)
	}
	src := t.TempDir()
	if err := os.WriteFile(filepath.Join(src, "tokenizer.json"), []byte(`{"model":{}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, err := tokenstore.Publish(ctx, store, "org/model", "", src); err != nil {
		t.Fatalf("sidecar publishes a tokenizer: %v", err)
	}
	// Its files change: published again, over the old objects.
	if err := os.WriteFile(filepath.Join(src, "tokenizer.json"), []byte(`{"model":{"type":"BPE"}}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, changed, err := tokenstore.Publish(ctx, store, "org/model", "", src); err != nil || !changed {
		t.Fatalf("sidecar publishes a changed tokenizer: changed %v, %v", changed, err)
	}

	ing := jsAs(t, url, "ingress", "ingress-pw")
	r, err := tokenstore.OpenReader(ctx, ing, tokenstore.Bucket, t.TempDir())
	if err != nil {
		t.Fatalf("ingress opens the tokenizer store: %v", err)
	}
	if _, _, err := r.Fetch(ctx, "org/model"); err != nil {
		t.Fatalf("ingress fetches a tokenizer: %v", err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	seen := make(chan string, 1)
	go func() {
		_ = r.Watch(wctx, func(m string) {
			select {
			case seen <- m:
			default:
			}
		})
	}()
	select {
	case m := <-seen:
		if m != "org/model" {
			t.Fatalf("ingress watch saw %q", m)
		}
	case <-wctx.Done():
		t.Fatal("ingress cannot watch the tokenizer store")
	}
	wcancel()

	short := func() context.Context {
		c, cc := context.WithTimeout(ctx, 3*time.Second)
		t.Cleanup(cc)
		return c
	}
	// Limits other than the defaults are applied to the existing stream
	// (natsutil.StreamConfig's rule): an update the ingress may not make.
	alter := natsutil.DefaultConfig().Stream
	alter.MaxAge = time.Hour
	if _, err := natsutil.EnsureStream(short(), ing, natsutil.Default(), alter, nil); err == nil {
		t.Fatal("the ingress user could alter the delta stream")
	}
	if _, err := ing.CreateStream(short(), jetstream.StreamConfig{Name: "KVMESH_OTHER", Subjects: []string{"kvmesh.other.>"}}); err == nil {
		t.Fatal("the ingress user could create a stream")
	}
	istore, err := ing.ObjectStore(short(), tokenstore.Bucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := istore.PutBytes(short(), "manifests/evil", []byte("{}")); err == nil {
		t.Fatal("the ingress user could write to the tokenizer store")
	}
	if err := ing.DeleteStream(short(), natsutil.Default().Stream()); err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("the ingress user could delete the stream (err %v)", err)
	}

	// The sidecar user has the JetStream API its role needs, no more: a
	// compromised sidecar can neither delete nor purge the delta stream,
	// nor delete the tokenizer store, nor make streams of its own.
	for name, err := range map[string]error{
		"delete the delta stream":    side.DeleteStream(short(), natsutil.Default().Stream()),
		"delete the tokenizer store": side.DeleteObjectStore(short(), tokenstore.Bucket),
		"create a stream": func() error {
			_, err := side.CreateStream(short(), jetstream.StreamConfig{Name: "KVMESH_OTHER", Subjects: []string{"kvmesh.other.>"}})
			return err
		}(),
		"purge the delta stream": func() error {
			s, err := side.Stream(ctx, natsutil.Default().Stream())
			if err != nil {
				return nil
			}
			return s.Purge(short())
		}(),
		"delete a delta stream message": func() error {
			s, err := side.Stream(ctx, natsutil.Default().Stream())
			if err != nil {
				return nil
			}
			return s.DeleteMsg(short(), 1)
		}(),
	} {
		if err == nil || errors.Is(err, jetstream.ErrStreamNotFound) {
			t.Errorf("the sidecar user could %s (err %v)", name, err)
		}
	}
	if _, err := side.Stream(ctx, natsutil.Default().Stream()); err != nil {
		t.Fatalf("the delta stream is gone: %v", err)
	}
}
