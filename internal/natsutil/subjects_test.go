package natsutil_test

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestEnsureStreamAddsOurSubject (tester h-natsops F1): an operator's
// KVMESH_DELTAS whose subjects do not capture kvmesh.delta.> stored nothing
// and every publish timed out waiting for its ack, with no word about the
// stream. Ensuring it adds our subject (keeping the operator's), says so,
// and the stream then stores deltas; a stream on a wider wildcard is left
// alone. When our subject cannot be added (another stream holds it), the
// error names the stream, its subjects and the fix.
func TestEnsureStreamAddsOurSubject(t *testing.T) {
	js, ctx, logs, log := streamRig(t)

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.Default().Stream(), Subjects: []string{"foo.>"}}); err != nil {
		t.Fatal(err)
	}
	s, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log)
	if err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Subjects; !slices.Equal(got, []string{"foo.>", natsutil.Default().DeltaWildcard()}) {
		t.Fatalf("subjects after ensure: %v", got)
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "did not capture kvmesh.delta.>") || !strings.Contains(l, "[foo.>]") {
		t.Fatalf("the subjects change is not warned about:\n%s", l)
	}
	if _, err := js.Publish(ctx, natsutil.Default().DeltaSubject("m", "e0"), []byte("x")); err != nil {
		t.Fatalf("publish to the corrected stream: %v", err)
	}

	// Subjects inside ours (NATS refuses them beside it as overlapping)
	// give way to it; the operator's others stay.
	for _, inside := range []string{"kvmesh.delta.*", "kvmesh.delta.m.e0"} {
		if err := js.DeleteStream(ctx, natsutil.Default().Stream()); err != nil {
			t.Fatal(err)
		}
		if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.Default().Stream(), Subjects: []string{"foo.>", inside}}); err != nil {
			t.Fatal(err)
		}
		if s, err = natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log); err != nil {
			t.Fatalf("%s: %v", inside, err)
		}
		if got := s.CachedInfo().Config.Subjects; !slices.Equal(got, []string{"foo.>", natsutil.Default().DeltaWildcard()}) {
			t.Fatalf("%s: subjects after ensure: %v", inside, got)
		}
	}

	// A wider wildcard captures ours: nothing to change.
	if err := js.DeleteStream(ctx, natsutil.Default().Stream()); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.Default().Stream(), Subjects: []string{"kvmesh.*.>"}}); err != nil {
		t.Fatal(err)
	}
	if s, err = natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log); err != nil {
		t.Fatal(err)
	}
	if got := s.CachedInfo().Config.Subjects; !slices.Equal(got, []string{"kvmesh.*.>"}) {
		t.Fatalf("a covering wildcard was changed: %v", got)
	}

	// Another stream holds our subject: ours cannot be added.
	if err := js.DeleteStream(ctx, natsutil.Default().Stream()); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "OTHER", Subjects: []string{"kvmesh.delta.m.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.Default().Stream(), Subjects: []string{"foo.>"}}); err != nil {
		t.Fatal(err)
	}
	_, err = natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log)
	if err == nil || !strings.Contains(err.Error(), "KVMESH_DELTAS exists with subjects [foo.>], which do not capture kvmesh.delta.>") ||
		!strings.Contains(err.Error(), "nats stream edit") {
		t.Fatalf("want an error naming the stream, its subjects and the fix, got %v", err)
	}
}

func TestSubjectsCover(t *testing.T) {
	for _, tc := range []struct {
		subjects []string
		want     bool
	}{
		{[]string{"kvmesh.delta.>"}, true},
		{[]string{"kvmesh.>"}, true},
		{[]string{">"}, true},
		{[]string{"foo.>", "kvmesh.*.>"}, true},
		{[]string{"kvmesh.delta.*"}, false},
		{[]string{"kvmesh.delta.m.>"}, false},
		{[]string{"kvmesh.delta"}, false},
		{[]string{"foo.>"}, false},
		{nil, false},
	} {
		if got := natsutil.SubjectsCover(tc.subjects, natsutil.Default().DeltaWildcard()); got != tc.want {
			t.Errorf("SubjectsCover(%v) = %v, want %v", tc.subjects, got, tc.want)
		}
	}
}

// TestEnsureStreamWarnsUnbounded (tester h-natsops F4): an operator's
// stream without limits is kept as it is (limits at their defaults never
// overwrite), and warned about: it grows until the server's storage is
// full. The stream a sidecar creates names its storage in the log.
func TestEnsureStreamWarnsUnbounded(t *testing.T) {
	js, ctx, logs, log := streamRig(t)

	if _, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log); err != nil {
		t.Fatal(err)
	}
	if l := logs.String(); !strings.Contains(l, "created the delta stream") || !strings.Contains(l, "storage=File") || strings.Contains(l, "no limits") {
		t.Fatalf("the created stream's log:\n%s", l)
	}
	if err := js.DeleteStream(ctx, natsutil.Default().Stream()); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.Default().Stream(), Subjects: []string{natsutil.Default().DeltaWildcard()}, Storage: jetstream.MemoryStorage}); err != nil {
		t.Fatal(err)
	}
	s, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log)
	if err != nil {
		t.Fatal(err)
	}
	if c := s.CachedInfo().Config; c.MaxAge != 0 || c.MaxBytes != -1 || c.Storage != jetstream.MemoryStorage {
		t.Fatalf("the operator's stream was changed: %+v", c)
	}
	if l := logs.String(); !strings.Contains(l, "level=WARN") || !strings.Contains(l, "has no limits") || !strings.Contains(l, "storage=Memory") {
		t.Fatalf("the unbounded stream is not warned about:\n%s", l)
	}
}

// A stream whose subjects alone are fixed is warned of as such, with no
// "changed the delta stream's limits" after it: no limit changed. A limit
// changed with the subjects is said, without the subjects (tester h-reg8 F6).
func TestEnsureStreamSubjectsOnlyNoLimitsLine(t *testing.T) {
	js, ctx, logs, log := streamRig(t)

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.Default().Stream(), Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, log); err != nil {
		t.Fatal(err)
	}
	if l := logs.String(); !strings.Contains(l, "added it to its subjects") || strings.Contains(l, "limits to this sidecar's") {
		t.Fatalf("want the subjects warning and no limits line:\n%s", l)
	}

	if err := js.DeleteStream(ctx, natsutil.Default().Stream()); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.Default().Stream(), Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	var logs2 testutil.SyncBuffer
	cfg := natsutil.DefaultConfig().Stream
	cfg.MaxAge = 7 * time.Minute
	if _, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), cfg, slog.New(slog.NewTextHandler(&logs2, nil))); err != nil {
		t.Fatal(err)
	}
	var line string
	for _, l := range strings.Split(logs2.String(), "\n") {
		if strings.Contains(l, "limits to this sidecar's") {
			line = l
		}
	}
	if !strings.Contains(line, "max_age") || strings.Contains(line, "subjects") {
		t.Fatalf("want a limits line naming max_age and not the subjects:\n%s", logs2.String())
	}
}

// streamRig is an embedded NATS server's JetStream, a 30 s context and a
// logger whose lines the test reads.
func streamRig(t *testing.T) (jetstream.JetStream, context.Context, *testutil.SyncBuffer, *slog.Logger) {
	t.Helper()
	srv := testutil.NATS(t)
	_, js := testutil.JetStream(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	logs := &testutil.SyncBuffer{}
	return js, ctx, logs, slog.New(slog.NewTextHandler(logs, nil))
}
