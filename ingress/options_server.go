package ingress

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
)

// NewServer builds, without starting, the replica o describes: the
// request-path components o configures (keys, JWTs, limits, admission), the
// configured tokenizers and, with NATS, the tokenizers the sidecars publish.
// Run uses it; a process that serves the routing decision through another
// front end (the gateway's endpoint picker, epp.Run) uses it in place of Run.
// ctx bounds the components' background work (JWKS refresh).
func (o *Options) NewServer(ctx context.Context, log *slog.Logger) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	if o.Config.ID == "" { // as New names it, known to the series deps registers
		o.Config.ID = fmt.Sprintf("ingress-%08x", rand.Uint32())
	}
	deps, err := o.deps(ctx, log)
	if err != nil {
		return nil, err
	}
	cfg := o.Config
	if err := LoadTokenizers(&cfg, &deps); err != nil {
		return nil, err
	}
	if o.TokenizerStore && len(cfg.Cluster.NATSURLs) > 0 {
		// Models without a local tokenizer use the one their sidecars publish.
		deps.Tokenizers = NewStoreTokenizers(deps.Tokenizers, StoreTokenizersConfig{CacheDir: o.TokenizerCache, Registry: deps.Registry, Logger: log})
	}
	return New(cfg, deps)
}
