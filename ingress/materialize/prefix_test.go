package materialize_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/internal/tokenstore"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// TestPrefixesSeparateInstallations: two installations with their own
// --nats-prefix on ONE NATS server, each a real sidecar with an engine of
// the same name (m/e1) and a materializer, do not see each other: each
// index holds exactly its own engine's cache, each installation has its
// own stream, and a materializer on the default prefix sees nothing.
func TestPrefixesSeparateInstallations(t *testing.T) {
	srv := testutil.NATS(t)
	type inst struct {
		subj  natsutil.Subjects
		cache *meshtest.Cache
		idx   *meshtest.MapIndex
	}
	run := func(subj natsutil.Subjects, idx *meshtest.MapIndex) {
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		cfg := materialize.DefaultConfig()
		cfg.Conn, cfg.Index, cfg.Subjects = nc, idx, subj
		startMaterializer(t, cfg) // overlap_test.go
	}
	var insts []inst
	for i, prefix := range []string{"team-a", "team-b.kvmesh"} {
		subj, err := natsutil.NewSubjects(prefix)
		if err != nil {
			t.Fatal(err)
		}
		cache, sc := cacheEngine(t, srv.URL(), 64, uint64(11+i))
		sc.NATS.Prefix = prefix
		// Each installation's own tokenizer for the same model name.
		sc.Engines[0].TokenizerDir = t.TempDir()
		if err := os.WriteFile(filepath.Join(sc.Engines[0].TokenizerDir, "tokenizer.json"), []byte(`{"installation":"`+prefix+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		s := meshtest.StartSidecar(t, sc)
		testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
		in := inst{subj: subj, cache: cache, idx: meshtest.NewMapIndex()}
		run(subj, in.idx)
		insts = append(insts, in)
	}
	def := meshtest.NewMapIndex()
	run(natsutil.Subjects{}, def)
	for i, in := range insts {
		loadCache(t, in.cache, 20+10*i)
	}
	for _, in := range insts {
		testutil.WaitFor(t, 10*time.Second, in.subj.Prefix()+"'s index equals its own engine", func() bool { return indexEquals(in.idx, in.cache, "e1") })
	}
	// Both again after more load: deltas, not only the first snapshot.
	for _, in := range insts {
		loadCache(t, in.cache, 15)
	}
	for _, in := range insts {
		testutil.WaitFor(t, 10*time.Second, in.subj.Prefix()+"'s index follows its own deltas", func() bool { return indexEquals(in.idx, in.cache, "e1") })
	}
	if got := def.Keys("e1", kvevents.TierGPU); len(got) != 0 {
		t.Fatalf("the default prefix's materializer indexed %d keys of another installation", len(got))
	}

	_, js := testutil.JetStream(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, in := range insts {
		s, err := js.Stream(ctx, in.subj.Stream())
		if err != nil {
			t.Fatalf("stream %s: %v", in.subj.Stream(), err)
		}
		info, err := s.Info(ctx, jetstream.WithSubjectFilter(">"))
		if err != nil {
			t.Fatal(err)
		}
		if len(info.Config.Subjects) != 1 || info.Config.Subjects[0] != in.subj.DeltaWildcard() || len(info.State.Subjects) != 1 || info.State.Subjects[in.subj.DeltaSubject("m", "e1")] == 0 {
			t.Fatalf("stream %s: subjects %v, holding %v", in.subj.Stream(), info.Config.Subjects, info.State.Subjects)
		}
	}
	if _, err := js.Stream(ctx, "KVMESH_DELTAS"); err == nil {
		t.Fatal("the default stream exists: an installation with a prefix created it")
	}
	// Each installation's tokenizer in its own object store.
	digests := map[string]bool{}
	for _, in := range insts {
		var m tokenstore.Manifest
		testutil.WaitFor(t, 10*time.Second, in.subj.TokenizerBucket()+" holds m's tokenizer", func() bool {
			r, err := tokenstore.OpenReader(ctx, js, in.subj.TokenizerBucket(), t.TempDir())
			if err != nil {
				return false
			}
			m, err = r.Manifest(ctx, "m")
			return err == nil
		})
		digests[m.Files["tokenizer.json"]] = true
	}
	if len(digests) != 2 {
		t.Fatalf("the two installations' tokenizers share a digest: %v", digests)
	}
	if _, err := js.ObjectStore(ctx, tokenstore.Bucket); err == nil {
		t.Fatal("the default tokenizer store exists: an installation with a prefix created it")
	}
}
