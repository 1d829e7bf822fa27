package ingress

import "log/slog"

// NewServer builds, without starting, the replica o describes: the same
// components Run builds (keys, limits, admission, tokenizers). A process
// that serves the routing decision through another front end (the gateway's
// endpoint picker, epp.Run) uses it in place of Run.
func (o *Options) NewServer(log *slog.Logger) (*Server, error) {
	if err := o.Validate(); err != nil {
		return nil, err
	}
	deps, err := o.deps(log)
	if err != nil {
		return nil, err
	}
	cfg := o.Config
	if err := LoadTokenizers(&cfg, &deps); err != nil {
		return nil, err
	}
	return New(cfg, deps)
}
