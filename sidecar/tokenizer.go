package sidecar

import (
	"context"
	"errors"
	"io/fs"
	"log/slog"
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
	p := tokenizerPublisher{dir: e.cfg.TokenizerDir,
		log: e.s.log.With("engine", e.cfg.ID, "model", e.cfg.Model, "tokenizer_dir", e.cfg.TokenizerDir),
		publish: func(ctx context.Context) (tokenstore.Manifest, bool, error) {
			store, err := tokenstore.EnsureBucket(ctx, js, e.s.subj.TokenizerBucket(), e.s.cfg.NATS.Stream.Replicas, e.s.cfg.NATS.Stream.Memory)
			if err != nil {
				return tokenstore.Manifest{}, false, err
			}
			return tokenstore.PublishLimited(ctx, store, e.cfg.Model, e.cfg.TokenizerRevision, e.cfg.TokenizerDir, js.Conn().MaxPayload())
		}}
	for {
		t := time.NewTimer(p.step(ctx))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}

// tokenizerPublisher is tokenizerLoop's state between checks.
type tokenizerPublisher struct {
	dir     string
	log     *slog.Logger
	publish func(context.Context) (m tokenstore.Manifest, changed bool, err error)

	lastStamp string // the files' stamp last published (or last found without tokenizer.json)
	fail      int    // publishes failed in a row
	absent    bool   // tokenizer.json is missing, and the log said so
}

// step checks the directory once, publishing when its files changed, and
// returns how long to wait before the next check. A directory without
// tokenizer.json (not there yet: a node's model cache or a download that
// fills it after the sidecar starts) is said once, then watched every
// tokenizerCheckInterval without a warning each time; it is published when
// the file appears. Other failures are retried with backoff, each logged.
func (p *tokenizerPublisher) step(ctx context.Context) time.Duration {
	stamp := dirStamp(p.dir)
	if stamp == p.lastStamp {
		return tokenizerCheckInterval
	}
	if _, err := os.Stat(filepath.Join(p.dir, tokenstore.Files[0])); errors.Is(err, fs.ErrNotExist) {
		if !p.absent {
			p.log.Warn("no tokenizer.json in the tokenizer directory (yet): the ingresses get no tokenizer for the model "+
				"from this sidecar until it appears; it is published then (checked every "+tokenizerCheckInterval.String()+")",
				"file", filepath.Join(p.dir, tokenstore.Files[0]))
		}
		p.absent, p.lastStamp, p.fail = true, stamp, 0
		return tokenizerCheckInterval
	}
	m, changed, err := p.publish(ctx)
	if err != nil {
		p.fail++
		wait := tokenizerBackoff(p.fail)
		p.log.Warn("publish tokenizer", "err", err, "retry_in", wait)
		return wait
	}
	p.fail, p.lastStamp, p.absent = 0, stamp, false
	p.log.Info("tokenizer published", "revision", m.Revision, "changed", changed)
	return tokenizerCheckInterval
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
