package natsutil_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A stream whose subjects alone are fixed is warned of as such, with no
// "changed the delta stream's limits" after it: no limit changed. A limit
// changed with the subjects is said, without the subjects (tester h-reg8 F6).
func TestEnsureStreamSubjectsOnlyNoLimitsLine(t *testing.T) {
	srv := testutil.NATS(t)
	_, js := testutil.JetStream(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var logs testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.StreamName, Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := natsutil.EnsureStream(ctx, js, natsutil.DefaultConfig().Stream, log); err != nil {
		t.Fatal(err)
	}
	if l := logs.String(); !strings.Contains(l, "added it to its subjects") || strings.Contains(l, "limits to this sidecar's") {
		t.Fatalf("want the subjects warning and no limits line:\n%s", l)
	}

	if err := js.DeleteStream(ctx, natsutil.StreamName); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: natsutil.StreamName, Subjects: []string{"other.>"}}); err != nil {
		t.Fatal(err)
	}
	var logs2 testutil.SyncBuffer
	cfg := natsutil.DefaultConfig().Stream
	cfg.MaxAge = 7 * time.Minute
	if _, err := natsutil.EnsureStream(ctx, js, cfg, slog.New(slog.NewTextHandler(&logs2, nil))); err != nil {
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
