package gossip

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"os"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvmesh/kvmesh/internal/backoff"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Node is one member of the kvmesh gossip cluster. All methods are safe for
// concurrent use. Close (graceful leave) and Shutdown (abrupt, as a crash)
// are idempotent; after either, the view is empty.
type Node struct {
	cfg       Config
	log       *slog.Logger
	ml        *memberlist.Memberlist
	queue     *memberlist.TransmitLimitedQueue
	metaBytes []byte
	// maxBroadcast is the largest entry a gossip packet carries.
	maxBroadcast int
	keyring      *memberlist.Keyring // nil without encryption
	m            metrics
	// gen is this process's generation (NodeMeta.Gen; 0 with
	// cfg.noGeneration), which tags its entries (generation.go).
	gen uint64
	// versionNow is the clock own entries are versioned by.
	versionNow func() int64

	// mu guards everything below; held only for map work, never across I/O
	// or callbacks.
	mu      sync.Mutex
	alive   map[string]NodeMeta // member name → metadata
	addrs   map[string]string   // member name → "ip:port", for missingSeeds
	entries map[entryKey]*entry // all known entries, own ones included
	// gens holds each alive member's advertised generation; pending the
	// entries of a generation their member does not advertise yet, at
	// most maxPending (generation.go).
	gens    map[string]memberGen
	pending map[entryKey]*entry
	dirty   map[entryKey]bool // own entries changed since the last broadcast
	// oversize holds the own keys logged as too large for a broadcast.
	oversize map[entryKey]bool
	// relayed holds the own entries last handed to the relay, by key: an
	// entry set again unchanged (the ingress shares its loads every load
	// interval) is not relayed again.
	relayed map[entryKey]*entry
	lastVer int64
	onApp   []func(node, name string, blob []byte)
	onLeave []func(node string)
	// conflicts holds the addresses whose name conflict was logged.
	conflicts map[string]bool
	ahead     aheadWarnings // origins warned about as relayed too far ahead (relay.go)
	routeWarn aheadWarnings // members warned about for entries with addresses they do not vouch for (routing.go)
	dups      dupWarnings   // engine ids and URLs held more than once (duplicates.go)

	// joiningAlone is set while this node, alone, joins a cluster: a name
	// conflict about itself then means it is the later of two members with
	// one name. taken is then the address of the member holding the name,
	// and this node stops (memberlist shut down, nothing published).
	// metOthers is set once another member was seen alive (EverJoined).
	metOthers atomic.Bool
	// seedsSelf is set once a join answered with this member alone
	// (SeedsOnlySelf).
	seedsSelf atomic.Bool

	joiningAlone atomic.Bool
	taken        atomic.Pointer[string]
	// created is ml once Create returned, for what memberlist's goroutines
	// may call before (numNodes).
	created atomic.Pointer[memberlist.Memberlist]

	// stop ends the broadcast and seed loops and every stream connection
	// of the transport; wg waits for the loops.
	stop context.CancelFunc
	wg   sync.WaitGroup
	once sync.Once
}

// ErrNameTaken is returned by New and Join when a live member of the
// cluster already has this node's name.
var ErrNameTaken = errors.New("gossip: the node name is taken by a live member")

// New validates cfg, starts the memberlist listener, tries the seeds once
// (and keeps retrying them in the background while alone) and starts the
// broadcast and seed loops.
func New(cfg Config) (*Node, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	if cfg.Name == "" {
		host, _ := os.Hostname()
		cfg.Name = fmt.Sprintf("%s-%08x", host, rand.Uint32())
	}
	cfg.Meta.Gen = 0
	if !cfg.noGeneration {
		cfg.Meta.Gen = newGeneration()
	}
	meta, err := encodeMeta(cfg.Meta)
	if err != nil {
		return nil, fmt.Errorf("gossip meta: %w", err)
	}
	versionNow := cfg.versionNow
	if versionNow == nil {
		versionNow = func() int64 { return time.Now().UnixNano() }
	}
	n := &Node{
		cfg: cfg, log: log.With("gossip", cfg.Name), metaBytes: meta, gen: cfg.Meta.Gen, versionNow: versionNow,
		alive: map[string]NodeMeta{}, addrs: map[string]string{}, entries: map[entryKey]*entry{}, dirty: map[entryKey]bool{},
		gens: map[string]memberGen{}, pending: map[entryKey]*entry{},
		conflicts: map[string]bool{}, oversize: map[entryKey]bool{}, relayed: map[entryKey]*entry{},
	}
	unregister, err := n.registerMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("gossip metrics: %w", err)
	}
	mc := profile(cfg.Profile)
	mc.Name = cfg.Name
	mc.BindAddr = cfg.BindAddr
	mc.BindPort = cfg.BindPort
	mc.AdvertisePort = cfg.BindPort
	if cfg.AdvertiseAddr != "" {
		mc.AdvertiseAddr = cfg.AdvertiseAddr
	}
	if cfg.AdvertisePort != 0 {
		mc.AdvertisePort = cfg.AdvertisePort
	}
	if len(cfg.SecretKey) > 0 {
		kr, err := memberlist.NewKeyring(cfg.ExtraKeys, cfg.SecretKey)
		if err != nil {
			unregister()
			return nil, fmt.Errorf("gossip keyring: %w", err)
		}
		mc.Keyring = kr
		n.keyring = kr
	}
	if w := unencryptedWarning(cfg); w != "" {
		n.log.Warn(w, "bind", cfg.BindAddr)
	}
	mc.PushPullInterval = cfg.PushPullInterval
	n.maxBroadcast = maxBroadcastBytes(mc, len(cfg.SecretKey) > 0)
	mc.Delegate = delegate{n}
	mc.Events = delegate{n}
	mc.Conflict = delegate{n}
	// A member restarted at another address under its old name takes the
	// name over once the old one is dead (memberlist's default, 0, keeps
	// the dead one's address until it is reaped).
	mc.DeadNodeReclaimTime = time.Nanosecond
	ctx, stop := context.WithCancel(context.Background())
	mc.LogOutput = nil
	mc.Logger = newMLLogger(n.log, ctx.Done()) // mllog.go: [ERR]/[WARN] at warn (restart noise lower), rate-limited; the rest at debug
	// The queue exists before memberlist does: its listener may ask for
	// broadcasts (answering a peer's ping) before Create returns.
	n.queue = &memberlist.TransmitLimitedQueue{NumNodes: n.numNodes, RetransmitMult: mc.RetransmitMult}
	fail := func(err error) (*Node, error) {
		stop()
		unregister() // a retry with the same registry must not find them taken
		return nil, err
	}
	tr, err := newTransport(ctx, mc)
	if err != nil {
		return fail(fmt.Errorf("gossip listen: %w", err))
	}
	mc.Transport = tr
	ml, err := memberlist.Create(mc)
	if err != nil {
		_ = tr.Shutdown() // memberlist leaves a given transport open when it fails before starting
		return fail(fmt.Errorf("gossip listen: %w", err))
	}
	n.ml = ml
	n.created.Store(ml)
	joinWarned := false
	if len(cfg.Join) > 0 {
		if _, err := n.Join(cfg.Join); errors.Is(err, ErrNameTaken) {
			return fail(err)
		} else if err != nil {
			n.log.Warn("gossip join failed; retrying in the background", "seeds", cfg.Join, "err", err)
			joinWarned = true
		}
	}
	n.stop = stop
	n.wg.Go(func() { n.loop(ctx) })
	if len(cfg.Join) > 0 {
		n.wg.Go(func() { n.seedLoop(ctx, joinWarned) })
	}
	return n, nil
}

func profile(name string) *memberlist.Config {
	switch name {
	case "local":
		return memberlist.DefaultLocalConfig()
	case "wan":
		return memberlist.DefaultWANConfig()
	default:
		return memberlist.DefaultLANConfig()
	}
}

// ErrNoEncryption is returned by the key methods of a node without a key.
var ErrNoEncryption = errors.New("gossip: encryption is off (no secret key)")

// InstallKey adds a key accepted for decryption (rotation step 1).
func (n *Node) InstallKey(key []byte) error {
	if n.keyring == nil {
		return ErrNoEncryption
	}
	return n.keyring.AddKey(key)
}

// UseKey makes an installed key the one gossip is encrypted with (step 2).
func (n *Node) UseKey(key []byte) error {
	if n.keyring == nil {
		return ErrNoEncryption
	}
	return n.keyring.UseKey(key)
}

// RemoveKey drops a key that is no longer primary (step 3).
func (n *Node) RemoveKey(key []byte) error {
	if n.keyring == nil {
		return ErrNoEncryption
	}
	return n.keyring.RemoveKey(key)
}

// Join contacts seeds ("host:port", DNS names allowed) and returns how many
// answered. A member with a different encryption key gets an error.
func (n *Node) Join(seeds []string) (int, error) {
	if err := n.nameTaken(); err != nil {
		return 0, err
	}
	if n.ml.NumMembers() <= 1 {
		n.joiningAlone.Store(true)
		defer n.joiningAlone.Store(false)
	}
	k, err := n.ml.Join(seeds)
	if err := n.nameTaken(); err != nil {
		// Refused: stop at once, without a leave message (that would be
		// taken as the other member's).
		_ = n.ml.Shutdown()
		return k, err
	}
	if err != nil {
		return k, fmt.Errorf("gossip join: %w", err)
	}
	if n.ml.NumMembers() <= 1 {
		// The seeds answered and are this member alone: the first member
		// of a mesh whose seed address lists itself only (a Kubernetes
		// Service with one member pod behind it).
		n.seedsSelf.Store(true)
	}
	return k, nil
}

// SeedsOnlySelf reports whether a join reached its seeds and found this
// member alone: the mesh's first member, alone by no fault of its seeds
// (Sidecar.Ready tells it apart from one whose seeds never answered).
func (n *Node) SeedsOnlySelf() bool { return n.seedsSelf.Load() }

func (n *Node) nameTaken() error {
	if addr := n.taken.Load(); addr != nil {
		return fmt.Errorf("%w: %q is the member's at %s; give each member its own name", ErrNameTaken, n.cfg.Name, *addr)
	}
	return nil
}

// nameConflict: other claims existing's name. memberlist keeps the member
// it knew first and ignores the other's claims about itself, but not the
// state entries the other gossips under that name: they would last as long
// as the first member. So a node that finds its own name taken while it
// joins from alone is the later one and stops (New and Join fail with
// ErrNameTaken; the loop ends); anywhere else the conflict is counted and
// logged.
func (n *Node) nameConflict(existing, other *memberlist.Node) {
	n.m.conflicts.Add(1)
	if existing.Name == n.cfg.Name && n.joiningAlone.Load() {
		addr := other.Address()
		n.taken.CompareAndSwap(nil, &addr)
		return
	}
	n.mu.Lock()
	first := !n.conflicts[other.Address()]
	if first && len(n.conflicts) < maxLoggedConflicts {
		n.conflicts[other.Address()] = true
	}
	n.mu.Unlock()
	if first { // every gossip round repeats the claim
		n.log.Error("two gossip members use one name; names must be unique (the member known first keeps it)",
			"member", existing.Name, "kept", existing.Address(), "ignored", other.Address())
	}
}

// maxLoggedConflicts bounds the addresses whose name conflict was logged.
const maxLoggedConflicts = 64

// numNodes is the cluster size the broadcast queue retransmits for (1
// until memberlist is created).
func (n *Node) numNodes() int {
	if ml := n.created.Load(); ml != nil {
		return ml.NumMembers()
	}
	return 1
}

// Name is this member's unique name.
func (n *Node) Name() string { return n.cfg.Name }

// Addr is this member's gossip address "ip:port" for others to join.
func (n *Node) Addr() string {
	ln := n.ml.LocalNode()
	return net.JoinHostPort(ln.Addr.String(), strconv.Itoa(int(ln.Port))) // [::1]:port for IPv6
}

// NumMembers counts alive members, this one included.
func (n *Node) NumMembers() int {
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.alive)
}

// Alone reports whether this member was given seeds (Config.Join) and sees
// no other alive member: its seeds did not answer (dead, unreachable, or
// another gossip key) or every other member is gone. Its state then
// reaches no one: a sidecar's engines get no traffic, an ingress routes to
// no engine. kvmesh_gossip_alone exports it; a member started without
// seeds (the first of a cluster) is never alone in this sense.
func (n *Node) Alone() bool {
	if len(n.cfg.Join) == 0 {
		return false
	}
	n.mu.Lock()
	defer n.mu.Unlock()
	return len(n.alive) == 1 // itself; 0 once closed
}

// EverJoined reports whether this member has seen another member alive
// since it started: false for one whose seeds never answered (dead or
// unreachable seeds, another gossip key), true for one that lost every
// other member after having some.
func (n *Node) EverJoined() bool { return n.metOthers.Load() }

// Members returns the metadata of every alive member by name.
func (n *Node) Members() map[string]NodeMeta {
	n.mu.Lock()
	defer n.mu.Unlock()
	return maps.Clone(n.alive)
}

// loop broadcasts own changed entries and re-broadcasts all of them now
// and then, and now and then looks for engines held twice (a pass over the
// entries, duplicates.go). It does nothing else: peers' routing reads these
// entries (loads, rate-limit usage, learned costs) every BroadcastInterval,
// so no network wait may hold it (joins are seedLoop's). Owned by Node;
// stopped by Close.
func (n *Node) loop(ctx context.Context) {
	tick := time.NewTicker(n.cfg.BroadcastInterval)
	defer tick.Stop()
	for i := 1; ; i++ {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		n.flush(i%10 == 0)
		if i%dupCheckEvery == 0 {
			n.checkDuplicates(time.Now())
		}
	}
}

// seedLoop retries the seeds while this node is alone and, less often,
// joins the seeds that are not members: a seed that restarted with no
// seeds of its own (the first sidecar of a cluster, started without
// --join) is alone, and the members that declared it dead would otherwise
// never contact it again. A join waits on each address in turn, up to the
// profile's TCPTimeout for one that does not answer (a dead pod's IP stays
// in a headless Service's DNS for minutes), hence its own goroutine. Owned
// by Node; stopped by Close, which also ends a join in progress (the
// transport closes its connections).
//
// While the node stays alone it warns at most once per aloneWarnEvery (a
// minute), the first time when a rejoin fails (New warned already when its
// own join failed), and says when it is no longer alone. joinWarned: New
// warned that its join failed.
func (n *Node) seedLoop(ctx context.Context, joinWarned bool) {
	wait := time.NewTimer(backoff.Jitter(n.cfg.RejoinInterval, 0.3)) // members cut off together do not retry together
	defer wait.Stop()
	lastCheck := time.Now()
	checkAfter := backoff.Jitter(seedCheckEvery*n.cfg.RejoinInterval, 0.3)
	every := n.cfg.aloneWarnEvery
	if every <= 0 {
		every = aloneWarnEvery
	}
	var aloneSince, aloneWarned time.Time
	if joinWarned {
		aloneSince, aloneWarned = time.Now(), time.Now()
	}
	for {
		select {
		case <-ctx.Done():
			return
		case <-wait.C:
		}
		if n.ml.NumMembers() > 1 && !aloneSince.IsZero() {
			n.log.Info("gossip member no longer alone", "members", n.ml.NumMembers(), "alone_for", time.Since(aloneSince).Round(time.Second))
			aloneSince, aloneWarned = time.Time{}, time.Time{}
		}
		switch {
		case n.ml.NumMembers() <= 1:
			now := time.Now()
			if aloneSince.IsZero() {
				aloneSince = now
			}
			resolved, other := n.seedAddrs(ctx)
			_, err := n.Join(append(resolved, other...))
			switch {
			case errors.Is(err, ErrNameTaken):
				n.log.Error("gossip stopped: this node's name is taken", "err", err)
				return
			case n.ml.NumMembers() > 1 || ctx.Err() != nil:
			case now.Sub(aloneWarned) >= every:
				aloneWarned = now
				if err == nil {
					err = errors.New("the seeds answered but no other member is alive (the seeds are this member alone)")
				}
				n.log.Warn("gossip member alone: no seed answered, this member's state reaches no other member (a sidecar's engines get no traffic); check --join and that every member has the same --gossip-key; retrying, warned once a minute (kvmesh_gossip_alone)",
					"seeds", n.cfg.Join, "alone_for", now.Sub(aloneSince).Round(time.Second), "err", err)
			default:
				n.log.Debug("gossip rejoin failed", "err", err)
			}
		case time.Since(lastCheck) >= checkAfter:
			lastCheck, checkAfter = time.Now(), backoff.Jitter(seedCheckEvery*n.cfg.RejoinInterval, 0.3)
			if missing := n.missingSeeds(ctx); len(missing) > 0 {
				if _, err := n.Join(missing); err != nil {
					n.log.Debug("gossip join of absent seeds failed", "seeds", missing, "err", err)
				}
			}
		}
		wait.Reset(backoff.Jitter(n.cfg.RejoinInterval, 0.3))
	}
}

// aloneWarnEvery is how often a member that stays alone warns.
const aloneWarnEvery = time.Minute

// seedCheckEvery × RejoinInterval is how often a node that is not alone
// looks for seeds that are not members (20s by default).
const seedCheckEvery = 10

// resolveTimeout bounds one round of seed lookups.
const resolveTimeout = 5 * time.Second

// seedAddrs resolves the "host:port" seeds' DNS names as memberlist would,
// but within a bound and ending with ctx (memberlist's lookup has no
// context). other holds the seeds in memberlist's further forms (a host
// without a port), which memberlist resolves itself.
func (n *Node) seedAddrs(ctx context.Context) (resolved, other []string) {
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	for _, seed := range n.cfg.Join {
		host, port, err := net.SplitHostPort(seed)
		if err != nil {
			other = append(other, seed)
			continue
		}
		ips, err := net.DefaultResolver.LookupHost(ctx, host)
		if err != nil {
			n.log.Debug("gossip seed not resolved", "seed", seed, "err", err)
			continue
		}
		for _, ip := range ips {
			resolved = append(resolved, net.JoinHostPort(ip, port))
		}
	}
	return resolved, other
}

// missingSeeds returns the seeds' addresses (DNS names resolved) at which
// no live member listens.
func (n *Node) missingSeeds(ctx context.Context) []string {
	// From the join/update callbacks, not memberlist.Members(): its nodes
	// are memberlist's own, written under its lock while we would read.
	live := map[string]bool{}
	n.mu.Lock()
	for _, a := range n.addrs {
		live[a] = true
	}
	n.mu.Unlock()
	resolved, _ := n.seedAddrs(ctx)
	var out []string
	for _, a := range resolved {
		if !live[a] {
			out = append(out, a)
		}
	}
	return out
}

// flush queues own dirty entries (all own entries when all is set) and
// hands the dirty ones to the relay. An entry too large for one broadcast
// packet is not queued (memberlist would keep it and never send it): it
// travels by push/pull and by the relay; it is counted each time and
// logged once per key.
func (n *Node) flush(all bool) {
	if n.taken.Load() != nil {
		return
	}
	type out struct {
		key       entryKey
		name      string
		msg       []byte
		relay     bool // changed since last relayed
		firstOver bool // too large, and not logged before
	}
	n.mu.Lock()
	var outs []out
	now := time.Now()
	for k, e := range n.entries {
		dirty := n.dirty[k]
		if k.origin != n.cfg.Name || !(all || dirty) {
			continue
		}
		b, err := encodeEntry(e.stamped(now))
		if err != nil {
			continue
		}
		o := out{key: k, name: fmt.Sprintf("%d/%s", k.kind, k.name), msg: b}
		if dirty && n.cfg.Relay != nil && !sameContent(n.relayed[k], e) {
			n.relayed[k] = e // own entries are replaced, never changed in place
			o.relay = true
		}
		if len(b) > n.maxBroadcast && !n.oversize[k] && len(n.oversize) < maxLoggedOversize {
			n.oversize[k] = true
			o.firstOver = true
		}
		outs = append(outs, o)
	}
	clear(n.dirty)
	n.mu.Unlock()
	for _, o := range outs {
		if o.relay {
			n.cfg.Relay.Relay(n.cfg.Name, o.name, o.msg)
		}
		if len(o.msg) <= n.maxBroadcast {
			n.queue.QueueBroadcast(&broadcast{name: o.name, msg: o.msg})
			continue
		}
		n.m.oversize.Add(1)
		if o.firstOver {
			n.log.Warn("gossip entry too large for a broadcast packet: it reaches peers by push/pull only (and by the NATS state lane where it runs); further ones of this key are counted in kvmesh_gossip_oversize_entries_total",
				"kind", kindName(o.key.kind), "name", o.key.name, "bytes", len(o.msg), "limit", n.maxBroadcast)
		}
	}
}

// sameContent: a and b (own entries of one key) differ at most in version.
func sameContent(a, b *entry) bool {
	if a == nil || b == nil {
		return false
	}
	switch {
	case (a.Engine == nil) != (b.Engine == nil),
		a.Engine != nil && *a.Engine != *b.Engine,
		!maps.Equal(a.InFlight, b.InFlight),
		!maps.Equal(a.Prefill, b.Prefill),
		!bytes.Equal(a.App, b.App):
		return false
	}
	return true
}

// maxLoggedOversize bounds the own keys whose oversize was logged (own
// keys are few: this member's engines, its in-flight entry, app names).
const maxLoggedOversize = 256

// kindName names an entry kind in logs.
func kindName(k uint8) string {
	switch k {
	case kindEngine:
		return "engine"
	case kindInFlight:
		return "inflight"
	case kindApp:
		return "app"
	}
	return strconv.Itoa(int(k))
}

// maxBroadcastBytes is the largest entry memberlist piggybacks on a gossip
// packet: UDPBufferSize less its compound header (2), the encryption
// overhead with a key (29, version 1), the compound entry overhead (2) and
// the user-message type byte (1) (memberlist v0.7 state.go gossip,
// broadcast.go getBroadcasts, queue.go GetBroadcasts).
func maxBroadcastBytes(mc *memberlist.Config, encrypted bool) int {
	n := mc.UDPBufferSize - 2 - 2 - 1
	if encrypted {
		n -= 29
	}
	return n
}

// setLocal replaces one own entry; the loop broadcasts it. Its version is
// this process's wall clock, made monotonic here; across processes under
// one name the generation orders entries instead (generation.go).
func (n *Node) setLocal(e *entry) {
	e.Origin = n.cfg.Name
	e.Gen = n.gen
	e.at, e.ageAt = time.Now(), 0
	n.mu.Lock()
	defer n.mu.Unlock()
	v := n.versionNow()
	if v <= n.lastVer {
		v = n.lastVer + 1
	}
	n.lastVer = v
	e.Version = v
	n.entries[e.key()] = e
	n.dirty[e.key()] = true
}

// SetEngine publishes (replaces) the state of one engine this node serves.
func (n *Node) SetEngine(s EngineState) {
	if !(s.KVUsage >= 0 && s.KVUsage <= 1) { // NaN would make the JSON entry unencodable
		s.KVUsage = 0
	}
	n.setLocal(&entry{Kind: kindEngine, Name: s.ID, Engine: &s})
}

// SetInFlight publishes this ingress's in-flight requests per engine id
// (replacing the previous map; the map is copied).
func (n *Node) SetInFlight(inflight map[string]int) {
	n.SetLoads(inflight, nil)
}

// SetLoads publishes this ingress's in-flight requests and P/D prefill
// legs per engine id in one entry (replacing the previous maps, which are
// copied).
func (n *Node) SetLoads(inflight map[string]int, prefill map[string]PrefillLoad) {
	e := &entry{Kind: kindInFlight, InFlight: maps.Clone(inflight)}
	if len(prefill) > 0 {
		e.Prefill = maps.Clone(prefill)
	}
	n.setLocal(e)
}

// SetAppState publishes an opaque blob (at most 4 KiB) under name for this
// node; peers receive it through OnAppState. Last writer per (node, name) wins.
func (n *Node) SetAppState(name string, blob []byte) error {
	if name == "" || len(blob) > maxAppBlob {
		return fmt.Errorf("%w: app state %q of %d bytes (limit %d)", ErrConfig, name, len(blob), maxAppBlob)
	}
	n.setLocal(&entry{Kind: kindApp, Name: name, App: append([]byte(nil), blob...)})
	return nil
}

// OnAppState registers fn to receive every newer app blob from other
// members. fn runs on a memberlist goroutine and must not block.
func (n *Node) OnAppState(fn func(node, name string, blob []byte)) {
	n.mu.Lock()
	n.onApp = append(n.onApp, fn)
	n.mu.Unlock()
}

// OnLeave registers fn to learn that a member left or died (its state is
// gone). fn runs on a memberlist goroutine and must not block.
func (n *Node) OnLeave(fn func(node string)) {
	n.mu.Lock()
	n.onLeave = append(n.onLeave, fn)
	n.mu.Unlock()
}

// AppStates returns the current blobs under name by origin node, own included.
func (n *Node) AppStates(name string) map[string][]byte {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string][]byte{}
	for k, e := range n.entries {
		if k.kind == kindApp && k.name == name {
			out[k.origin] = e.App
		}
	}
	return out
}

// Engines returns every engine gossiped by an alive member, sorted by id.
// When two members claim one engine (a sidecar moved to another node
// overlapping its old self, two sidecars given one engine id), the state
// set last wins (newerView).
func (n *Node) Engines() []EngineView {
	now := time.Now()
	n.mu.Lock()
	byID := map[string]EngineView{}
	for k, e := range n.entries {
		if k.kind != kindEngine {
			continue
		}
		v := EngineView{EngineState: *e.Engine, Node: k.origin, Updated: time.Unix(0, e.Version), Age: e.age(now)}
		if old, ok := byID[k.name]; !ok || newerView(v, old) {
			byID[k.name] = v
		}
	}
	n.mu.Unlock()
	out := make([]EngineView, 0, len(byID))
	for _, v := range byID {
		out = append(out, v)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Engine returns one engine's newest state; ok is false when no alive member
// gossips it.
func (n *Node) Engine(id string) (EngineView, bool) {
	now := time.Now()
	n.mu.Lock()
	defer n.mu.Unlock()
	var best EngineView
	found := false
	for k, e := range n.entries {
		if k.kind != kindEngine || k.name != id {
			continue
		}
		v := EngineView{EngineState: *e.Engine, Node: k.origin, Updated: time.Unix(0, e.Version), Age: e.age(now)}
		if !found || newerView(v, best) {
			best, found = v, true
		}
	}
	return best, found
}

// newerView reports whether a, one member's state of an engine, is newer
// than b, another member's state of it. Each member keeps one entry per
// engine (its versions order it), so a and b come from two origins, whose
// versions are their own wall clocks: compared, a host whose clock is ahead
// would win with older state. Their ages are not: each is the time since
// the origin set the entry, counted on monotonic clocks (state.go), so the
// younger wins. Versions decide only when an age is unknown (a member that
// predates ages), and the member name breaks a tie, so that the choice does
// not follow map order.
func newerView(a, b EngineView) bool {
	switch {
	case a.Age >= 0 && b.Age >= 0:
		if a.Age != b.Age {
			return a.Age < b.Age
		}
	case !a.Updated.Equal(b.Updated):
		return a.Updated.After(b.Updated)
	}
	return a.Node < b.Node
}

// EngineHead returns an engine's gossiped delta head and digest (for the
// materializer's consistency check).
func (n *Node) EngineHead(id string) (kvevents.EngineDigest, bool) {
	v, ok := n.Engine(id)
	return v.Digest, ok
}

// InFlight returns the cluster-wide in-flight requests per engine: the sum
// over every alive ingress's last gossiped counts, this node's included.
func (n *Node) InFlight() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]int{}
	for k, e := range n.entries {
		if k.kind != kindInFlight {
			continue
		}
		for eng, c := range e.InFlight {
			out[eng] += c
		}
	}
	return out
}

// PrefillLoads returns the cluster-wide P/D prefill legs per prefill
// engine: the sum over every alive ingress's last gossiped loads, this
// node's included.
func (n *Node) PrefillLoads() map[string]PrefillLoad {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := map[string]PrefillLoad{}
	for k, e := range n.entries {
		if k.kind != kindInFlight {
			continue
		}
		for eng, l := range e.Prefill {
			t := out[eng]
			t.Legs += l.Legs
			t.Queued += l.Queued
			out[eng] = t
		}
	}
	return out
}

// merge applies entries received from peers: entries of alive origins, of
// the generation the origin advertises (generation.go), newer versions
// winning; own entries are never overwritten by echoes.
func (n *Node) merge(es []*entry) (accepted int) {
	type appEvent struct {
		node, name string
		blob       []byte
	}
	var apps []appEvent
	var refused []routeRefusal
	now := time.Now()
	n.mu.Lock()
	for _, e := range es {
		k := e.key()
		e.received(now)
		if e.Origin == n.cfg.Name {
			continue
		}
		if _, ok := n.alive[e.Origin]; !ok {
			n.m.ignored.Add(1) // a dead member's state must not come back through someone's push/pull
			continue
		}
		switch admit(n.gens[e.Origin], e) {
		case admitDrop:
			n.m.ignored.Add(1)
			continue
		case admitHold:
			n.m.ignored.Add(1) // counted once more as received if adopted
			n.holdLocked(e)
			continue
		}
		old, ok := n.entries[k]
		if v, want := checkRoute(n.alive[e.Origin], old, e); v != routeOK {
			n.refuseRouteLocked(v, want, e, &refused)
			continue
		}
		if ok && old.Version >= e.Version {
			n.m.ignored.Add(1)
			continue
		}
		n.entries[k] = e
		n.m.received.Add(1)
		accepted++
		if e.Kind == kindApp {
			apps = append(apps, appEvent{e.Origin, e.Name, e.App})
		}
	}
	cbs := n.onApp
	n.mu.Unlock()
	n.warnRoutes(refused)
	for _, a := range apps {
		for _, fn := range cbs {
			fn(a.node, a.name, a.blob)
		}
	}
	return accepted
}

// snapshotEntries copies the entries of alive origins for push/pull, each
// carrying its age now.
func (n *Node) snapshotEntries() []*entry {
	n.mu.Lock()
	defer n.mu.Unlock()
	now := time.Now()
	out := make([]*entry, 0, len(n.entries))
	for _, e := range n.entries {
		out = append(out, e.stamped(now))
	}
	return out
}

// memberUp records a member that joined or whose metadata changed. A new
// generation in its metadata is the member restarted under its name: the
// predecessor's entries go, the ones held for the new generation come in
// (generation.go).
func (n *Node) memberUp(node *memberlist.Node) {
	meta, err := decodeMeta(node.Meta)
	if err != nil {
		n.m.malformed.Add(1) // still a member: failure detection works without metadata
	}
	n.mu.Lock()
	_, known := n.alive[node.Name]
	n.alive[node.Name] = meta
	n.addrs[node.Name] = net.JoinHostPort(node.Addr.String(), strconv.Itoa(int(node.Port)))
	restarted, prev, apps, refused := n.generationLocked(node.Name, meta.Gen, err == nil)
	cbs := n.onApp
	n.mu.Unlock()
	n.warnRoutes(refused)
	if node.Name != n.cfg.Name {
		n.metOthers.Store(true)
	}
	if !known {
		n.log.Info("gossip member up", "member", node.Name, "role", meta.Role, "id", meta.ID)
	}
	if restarted {
		n.m.restarts.Add(1)
		n.log.Info("gossip member restarted under the same name: its predecessor's state is dropped",
			"member", node.Name, "role", meta.Role, "generation", fmt.Sprintf("%016x", meta.Gen), "previous", fmt.Sprintf("%016x", prev))
	}
	for _, a := range apps {
		for _, fn := range cbs {
			fn(a.Origin, a.Name, a.App)
		}
	}
}

func (n *Node) memberDown(name string) {
	n.mu.Lock()
	delete(n.alive, name)
	delete(n.addrs, name)
	n.forgetGenerationLocked(name)
	for k := range n.entries {
		if k.origin == name {
			delete(n.entries, k)
		}
	}
	cbs := n.onLeave
	n.mu.Unlock()
	n.log.Info("gossip member down", "member", name)
	for _, fn := range cbs {
		fn(name)
	}
}

// Close leaves the cluster gracefully (peers drop this node's engines at
// once) and stops. A join in progress is abandoned. Safe to call twice.
func (n *Node) Close() error {
	var err error
	n.once.Do(func() {
		n.stop()
		n.wg.Wait()
		if n.taken.Load() != nil { // refused: memberlist is down already, and its name is not ours to leave
		} else if lerr := n.ml.Leave(time.Second); lerr != nil {
			err = fmt.Errorf("gossip leave: %w", lerr)
		}
		if serr := n.ml.Shutdown(); serr != nil && err == nil {
			err = fmt.Errorf("gossip shutdown: %w", serr)
		}
		n.forget()
	})
	return err
}

// Shutdown stops without leaving, as a crash would: peers find out through
// failure detection. Safe to call twice, and after Close.
func (n *Node) Shutdown() {
	n.once.Do(func() {
		n.stop()
		n.wg.Wait()
		_ = n.ml.Shutdown()
		n.forget()
	})
}

func (n *Node) forget() {
	n.mu.Lock()
	clear(n.alive)
	clear(n.entries)
	clear(n.gens)
	clear(n.pending)
	n.mu.Unlock()
}

// unencryptedWarning is the warning for gossip without a key on an address
// other hosts reach ("" with a key, or bound to loopback): anyone who
// reaches the gossip port can join and gossip engine state, and an empty
// key (an empty Secret value) turns encryption off without a word.
func unencryptedWarning(cfg Config) string {
	if len(cfg.SecretKey) > 0 {
		return ""
	}
	if ip := net.ParseIP(cfg.BindAddr); ip != nil && ip.IsLoopback() {
		return ""
	}
	return "gossip is not encrypted: any host that reaches the gossip port can join and gossip engine state; give every member the same --gossip-key (or $KVMESH_GOSSIP_KEY, which is empty here if it is set)"
}
