package sidecar

import (
	"context"
	"os"
	"path/filepath"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/tokenstore"
)

// tokenizerCheckInterval is how often a published tokenizer directory is
// checked for changed files (a stat per file; a publish only on change).
const tokenizerCheckInterval = 30 * time.Second

// tokenizerLoop publishes the engine's tokenizer files to the mesh's object
// store (internal/tokenstore), so ingresses need no local copy, and publishes
// again when the files change. Owned by Run; ends with ctx. Failures are logged
// and retried with jittered backoff: a missing tokenizer costs ingresses their
// cache-aware routing for the model, never a request.
func (e *engine) tokenizerLoop(ctx context.Context, js jetstream.JetStream) {
	dir := e.cfg.TokenizerDir
	log := e.s.log.With("engine", e.cfg.ID, "model", e.cfg.Model, "tokenizer_dir", dir)
	var lastStamp string
	fail := 0
	for {
		wait := tokenizerCheckInterval
		if stamp := dirStamp(dir); stamp != lastStamp {
			store, err := tokenstore.EnsureBucket(ctx, js, e.s.cfg.NATS.Stream.Replicas, e.s.cfg.NATS.Stream.Memory)
			var m tokenstore.Manifest
			var changed bool
			if err == nil {
				m, changed, err = tokenstore.PublishLimited(ctx, store, e.cfg.Model, e.cfg.TokenizerRevision, dir, js.Conn().MaxPayload())
			}
			switch {
			case err != nil:
				fail++
				wait = tokenizerBackoff(fail)
				log.Warn("publish tokenizer", "err", err, "retry_in", wait)
			default:
				fail, lastStamp = 0, stamp
				log.Info("tokenizer published", "revision", m.Revision, "changed", changed)
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// tokenizerBackoff: 1 s doubling to 30 s, with up to 50 % jitter so the
// sidecars of a model do not retry in step after a NATS outage.
func tokenizerBackoff(fail int) time.Duration {
	d := time.Second << min(fail-1, 5)
	d = min(d, 30*time.Second)
	return d/2 + time.Duration(time.Now().UnixNano()%int64(d/2+1))
}

// dirStamp summarizes the published files' sizes and modification times.
func dirStamp(dir string) string {
	var s []byte
	for _, f := range tokenstore.Files {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			s = append(s, '-')
			continue
		}
		s = append(s, st.ModTime().UTC().Format(time.RFC3339Nano)...)
		s = append(s, '/')
		s = append(s, []byte(st.Name())...)
		s = append(s, byte(st.Size()), byte(st.Size()>>8), byte(st.Size()>>16), byte(st.Size()>>24))
	}
	return string(s)
}
