package gossip

import "math/rand/v2"

// Generations. An entry's version is its origin's wall clock, kept
// monotonic only within one process: a member restarted under the same name
// (a fixed --node-name or --id) on a clock behind its predecessor's would
// have every entry taken as older than the dead process's, which every
// member would keep showing (frozen readiness and load) until the new one's
// clock passed the old versions, with no bound on an idle engine. Each
// process start therefore draws a random generation, advertises it in its
// node metadata and tags its entries with it. Memberlist orders metadata by
// its own incarnation numbers, which a live member raises above any older
// claim about itself (a restarted member refutes its predecessor's alive
// message with its new metadata), so the advertised generation is the live
// process's without any clock. A receiver accepts an origin's entries only
// of the generation its current metadata advertises; when it changes, the
// other generation's entries are dropped. Versions order entries within one
// generation only.
//
// Older members advertise and tag none (0): their entries are accepted
// while their metadata advertises none, ordered by version as before. They
// also strip the generation from the entries they forward by push/pull:
// such a copy of a newer member's entry carries 0 and is ignored (the
// member's own broadcasts, push/pulls and state lane still carry it).

// memberGen is what a member's metadata says of its generation.
type memberGen struct {
	// gen is the advertised generation (0: none, an older member).
	gen uint64
	// known is false while the metadata is malformed: then entries are
	// ordered by version alone, as before generations.
	known bool
	// valid: gen was read from well-formed metadata at least once.
	valid bool
	// retired is the generation the member advertised before gen (0:
	// none): entries of it still arriving (forwarded by push/pull, a late
	// relay) are the dead process's and are dropped, never held.
	retired uint64
}

// admission is merge's verdict on a received entry.
type admission int

const (
	admitNow  admission = iota // of the advertised generation: ordered by version
	admitDrop                  // of another generation that will not be advertised
	admitHold                  // of a generation not yet advertised: held in pending
)

// admit decides on e, an entry of a member whose generation is g.
func admit(g memberGen, e *entry) admission {
	switch {
	case !g.known || e.Gen == g.gen:
		return admitNow
	case e.Gen == 0 || e.Gen == g.retired:
		// 0 under a generation: a member's predecessor of an older
		// version, or a copy an older member forwarded without its
		// generation. Neither is held: the first never comes back and the
		// second could be the live process's entry or its predecessor's.
		return admitDrop
	default:
		return admitHold
	}
}

// maxPending bounds the entries held for a generation their member does
// not advertise yet. They are needed only in the moment of a restart under
// the same name (the new process's entries reach a receiver in the same
// push/pull that starts its refutation, before its metadata does); an entry
// dropped for want of room comes again with the next re-broadcast.
const maxPending = 4096

// newGeneration draws a process's generation: random (never 0), so that
// restarts under one name differ without any clock or stored state.
func newGeneration() uint64 {
	for {
		if g := rand.Uint64(); g != 0 {
			return g
		}
	}
}

// holdLocked keeps e, of a generation its member does not advertise yet,
// until the member's metadata advertises it (adoptLocked) or changes to
// another. Called with n.mu held.
func (n *Node) holdLocked(e *entry) {
	k := e.key()
	old, ok := n.pending[k]
	if ok && old.Gen == e.Gen && old.Version >= e.Version {
		return
	}
	if !ok && len(n.pending) >= maxPending {
		return
	}
	n.pending[k] = e
}

// generationLocked records what node's metadata says of its generation (ok
// is false for malformed metadata) and, when the generation changed, drops
// the entries of any other one and adopts those held for the new one. It
// returns whether the member restarted (a generation advertised before was
// replaced by another), the one it replaced, the adopted app entries, for
// the OnAppState callbacks, and the held entries refused for their
// addresses (checked now, against the metadata that advertises their
// generation: routing.go), for warnRoutes. Called with n.mu held, after
// n.alive holds name's metadata.
func (n *Node) generationLocked(name string, gen uint64, ok bool) (restarted bool, prev uint64, apps []*entry, refused []routeRefusal) {
	old, seen := n.gens[name]
	if !ok {
		// Malformed metadata says nothing of the generation: keep the
		// entries and order new ones by version (known false) until
		// well-formed metadata comes.
		old.known = false
		n.gens[name] = old
		return false, 0, nil, nil
	}
	if seen && old.known && old.gen == gen {
		return false, 0, nil, nil
	}
	cur := memberGen{gen: gen, known: true, valid: true, retired: old.retired}
	if seen && old.valid && old.gen != gen {
		restarted, prev, cur.retired = true, old.gen, old.gen
	}
	n.gens[name] = cur
	for k, e := range n.entries {
		if k.origin == name && e.Gen != gen {
			delete(n.entries, k)
		}
	}
	for k, e := range n.pending {
		if k.origin != name {
			continue
		}
		delete(n.pending, k)
		if e.Gen != gen {
			continue
		}
		have, ok := n.entries[k]
		if v, want := checkRoute(n.alive[name], have, e); v != routeOK {
			n.refuseRouteLocked(v, want, e, &refused)
			continue
		}
		if ok && have.Version >= e.Version {
			continue
		}
		n.entries[k] = e
		n.m.received.Add(1)
		if e.Kind == kindApp {
			apps = append(apps, e)
		}
	}
	return restarted, prev, apps, refused
}

// forgetGenerationLocked drops what is known of a member that left or
// died. Called with n.mu held.
func (n *Node) forgetGenerationLocked(name string) {
	delete(n.gens, name)
	for k := range n.pending {
		if k.origin == name {
			delete(n.pending, k)
		}
	}
}
