package learn

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
)

// Stats is what one router has measured of one engine (or of every engine,
// pooled): the sufficient statistics of both lines, i.e. the weighted sums
// of their normal equations, discounted by forgetting. Routers exchange
// Stats; adding two routers' Stats gives the sums over both routers'
// samples. w is a sample's weight, x the line's regressors, y its seconds.
type Stats struct {
	// Prefill is Σw, Σw·x, Σw·x², Σw·y, Σw·x·y with x the prefill tokens.
	Prefill [5]float64
	// Decode is Σw, Σw·x₁, Σw·x₂, Σw·x₁², Σw·x₁·x₂, Σw·x₂², Σw·y, Σw·x₁·y,
	// Σw·x₂·y with x₁ the context tokens and x₂ the sequences.
	Decode [9]float64
}

// EngineStats is one engine's Stats.
type EngineStats struct {
	Engine string
	// Samples is how many samples of the engine this router has observed
	// (Own sets it; not part of the shared sums, and SetPeer ignores it).
	Samples uint64
	Stats
}

// ErrStats wraps every reason a peer's Stats are refused.
var ErrStats = errors.New("learn: invalid shared stats")

// Check reports whether s could come from a learner: every sum finite, the
// weights and the sums of squares not negative, and each set of sums
// consistent with some samples (Cauchy–Schwarz on the regressors, within
// rounding). Sums that fail would let one peer bend every router's fit.
func (s *Stats) Check() error {
	for _, v := range s.Prefill {
		if !finite(v) {
			return fmt.Errorf("%w: prefill sum %v", ErrStats, v)
		}
	}
	for _, v := range s.Decode {
		if !finite(v) {
			return fmt.Errorf("%w: decode sum %v", ErrStats, v)
		}
	}
	p, d := &s.Prefill, &s.Decode
	if p[0] < 0 || p[2] < 0 || d[0] < 0 || d[3] < 0 || d[5] < 0 {
		return fmt.Errorf("%w: negative weight or sum of squares", ErrStats)
	}
	// (Σw·x)² ≤ Σw · Σw·x², with room for rounding.
	cs := func(w, sx, sxx float64) bool { return sx*sx <= w*sxx*(1+1e-9)+1e-9 }
	if !cs(p[0], p[1], p[2]) || !cs(d[0], d[1], d[3]) || !cs(d[0], d[2], d[5]) {
		return fmt.Errorf("%w: sums no set of samples has", ErrStats)
	}
	return nil
}

// stats returns m's sums as Stats.
func (m *model) stats() Stats {
	p, d := &m.prefill, &m.decode
	return Stats{
		Prefill: [5]float64{p.w, p.xtx[0][1], p.xtx[1][1], p.xty[0], p.xty[1]},
		Decode:  [9]float64{d.w, d.xtx[0][1], d.xtx[0][2], d.xtx[1][1], d.xtx[1][2], d.xtx[2][2], d.xty[0], d.xty[1], d.xty[2]},
	}
}

// fromStats is the model whose sums are s. A sample's first regressor is
// the constant 1, so Σw·1·1 = Σw.
func fromStats(s *Stats) model {
	var m model
	p := &s.Prefill
	m.prefill = reg{w: p[0], xty: [3]float64{p[3], p[4], 0}}
	m.prefill.xtx[0] = [3]float64{p[0], p[1], 0}
	m.prefill.xtx[1] = [3]float64{p[1], p[2], 0}
	d := &s.Decode
	m.decode = reg{w: d[0], xty: [3]float64{d[6], d[7], d[8]}}
	m.decode.xtx[0] = [3]float64{d[0], d[1], d[2]}
	m.decode.xtx[1] = [3]float64{d[1], d[3], d[4]}
	m.decode.xtx[2] = [3]float64{d[2], d[4], d[5]}
	return m
}

// Own appends this router's own Stats of every engine it has samples of,
// sorted by engine, and returns its own pooled Stats. Peers' shares are
// never in them: a router publishes only what it measured.
func (l *Learner) Own(dst []EngineStats) ([]EngineStats, Stats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := len(dst)
	for id, m := range l.engines {
		if m.prefill.w > 0 || m.decode.w > 0 {
			dst = append(dst, EngineStats{Engine: id, Samples: m.n, Stats: m.stats()})
		}
	}
	slices.SortFunc(dst[n:], func(a, b EngineStats) int { return cmp.Compare(a.Engine, b.Engine) })
	return dst, l.pooled.stats()
}

// MaxPeerEngines bounds the engines kept per peer; a peer's further engines
// are refused.
const MaxPeerEngines = 4096

// peer is what one other router shared: its pooled sums and the latest
// sums it sent per engine, under its learner's epoch (Share.Epoch; 0 for
// SetPeer's).
type peer struct {
	epoch   uint64
	pooled  model
	engines map[string]*model
}

// ErrRefused marks a share refused whole (no peer name, or implausible
// pooled sums): nothing of it was used. Other SetPeer errors name the
// engines dropped from a share whose rest was used.
var ErrRefused = errors.New("learn: share refused")

// SetPeer records what router name shared: its pooled Stats and the Stats
// of the engines listed (a share may list only some; an engine it does not
// list keeps its last Stats from that peer). Each engine's Stats replace
// that peer's previous ones. Invalid Stats are refused, all of the share
// (ErrRefused) when the name or the pooled ones are bad, else the bad
// engines alone; the error joins every reason.
func (l *Learner) SetPeer(name string, pooled Stats, engines []EngineStats) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.setPeer(name, 0, &pooled, engines)
}

// SetShare is SetPeer for a decoded share: a share under a new epoch (the
// router restarted under the same name) first drops what the old learner
// shared, so engines the new one has not measured yet do not keep its sums.
func (l *Learner) SetShare(name string, sh *Share) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.peers[name]; p != nil && p.epoch != sh.Epoch && sh.Pooled.Check() == nil {
		l.forgetPeer(name)
	}
	return l.setPeer(name, sh.Epoch, &sh.Pooled, sh.Engines)
}

// setPeer is SetPeer with l.mu held.
func (l *Learner) setPeer(name string, epoch uint64, pooled *Stats, engines []EngineStats) error {
	if name == "" {
		return fmt.Errorf("%w: %w: no peer name", ErrRefused, ErrStats)
	}
	if err := pooled.Check(); err != nil {
		return fmt.Errorf("%w: pooled: %w", ErrRefused, err)
	}
	var errs []error
	p := l.peers[name]
	if p == nil {
		p = &peer{engines: make(map[string]*model)}
		l.peers[name] = p
	}
	p.epoch = epoch
	p.pooled = fromStats(pooled)
	l.sumPooled()
	for i := range engines {
		e := &engines[i]
		if e.Engine == "" {
			errs = append(errs, fmt.Errorf("%w: no engine id", ErrStats))
			continue
		}
		if err := e.Stats.Check(); err != nil {
			errs = append(errs, fmt.Errorf("engine %q: %w", e.Engine, err))
			continue
		}
		m := p.engines[e.Engine]
		if m == nil {
			if len(p.engines) >= MaxPeerEngines {
				errs = append(errs, fmt.Errorf("%w: peer %q shares more than %d engines", ErrStats, name, MaxPeerEngines))
				continue
			}
			m = new(model)
			p.engines[e.Engine] = m
		}
		*m = fromStats(&e.Stats)
		l.sumEngine(e.Engine)
	}
	return errors.Join(errs...)
}

// ForgetPeer drops what router name shared (it left the cluster).
func (l *Learner) ForgetPeer(name string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.forgetPeer(name)
}

// forgetPeer is ForgetPeer with l.mu held.
func (l *Learner) forgetPeer(name string) {
	p := l.peers[name]
	if p == nil {
		return
	}
	delete(l.peers, name)
	l.sumPooled()
	for id := range p.engines {
		l.sumEngine(id)
	}
}

// Forget drops engine's lines, this router's own and what every peer
// shared of it (the engine left the cluster): a peer's share that no
// longer lists an engine would otherwise keep its last sums for good.
// The pooled sums keep the engine's samples, which forgetting wears off as
// it does any engine's. An engine seen again starts from the pooled lines.
func (l *Learner) Forget(engine string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.engines, engine)
	delete(l.shared, engine)
	for _, p := range l.peers {
		delete(p.engines, engine)
	}
	delete(l.cache, engine) // the pooled sums keep its samples: the others' estimates stand
}

// Engines appends the engines the learner holds lines of, its own or a
// peer's (unsorted; an engine may be listed more than once).
func (l *Learner) Engines(dst []string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	for id := range l.engines {
		dst = append(dst, id)
	}
	for _, p := range l.peers {
		for id := range p.engines {
			dst = append(dst, id)
		}
	}
	return dst
}

// Peers is how many routers' shares the estimates hold.
func (l *Learner) Peers() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.peers)
}

// sumEngine recomputes Σ over peers of engine id's sums (l.mu held).
// Summing afresh, not adding the difference, keeps rounding from piling up.
func (l *Learner) sumEngine(id string) {
	var s model
	for _, p := range l.peers {
		if m := p.engines[id]; m != nil {
			s.plus(m)
		}
	}
	if s.prefill.w == 0 && s.decode.w == 0 {
		delete(l.shared, id)
		return
	}
	if m := l.shared[id]; m != nil {
		*m = s
	} else {
		l.shared[id] = &s
	}
}

func (l *Learner) sumPooled() {
	l.changed()
	l.sharedP = model{}
	for _, p := range l.peers {
		l.sharedP.plus(&p.pooled)
	}
}

// Measured reports whether this router or a peer has samples of engine.
func (l *Learner) Measured(engine string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m model
	l.gather(&m, engine)
	return m.prefill.w > 0 || m.decode.w > 0
}

// FromShares is a learner at the default config holding the shares of
// states (gossip's app states under StateName, by origin) as its peers'.
// bad counts the shares that did not decode or held implausible sums
// (a partly implausible share keeps its plausible engines).
func FromShares(states map[string][]byte) (l *Learner, bad int) {
	l, _ = New(Config{}) // the default config is valid
	for origin, b := range states {
		sh, err := DecodeShare(b)
		if err == nil {
			err = l.SetShare(origin, &sh)
		}
		if err != nil {
			bad++
		}
	}
	return l, bad
}
