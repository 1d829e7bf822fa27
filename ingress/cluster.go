package ingress

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/scheduler"
)

// ClusterConfig connects a replica to the mesh. The zero value is a
// standalone replica (Config.Engines, speculative-only index).
type ClusterConfig struct {
	// GossipBind is the memberlist address ("127.0.0.1:0" picks a port).
	// Empty: no gossip.
	GossipBind string `yaml:"gossipBind"`
	// GossipAdvertise is the address others dial when it differs from the
	// bind address: "host" or "host:port" (NAT, pods). Empty: derived.
	GossipAdvertise string `yaml:"gossipAdvertise"`
	// GossipSeeds are members to join ("host:port").
	GossipSeeds []string `yaml:"gossipSeeds"`
	// GossipKey enables gossip encryption (16, 24 or 32 bytes).
	GossipKey []byte `yaml:"-"`
	// GossipKeys are further keys accepted (not used to encrypt) while the
	// key rotates (gossip.Config.ExtraKeys).
	GossipKeys [][]byte `yaml:"-"`
	// GossipProfile is memberlist's timing profile: local, lan (default) or wan.
	GossipProfile string `yaml:"gossipProfile"`
	// NATSURLs are the NATS servers carrying the sidecars' deltas. Empty: no
	// materialized index (routing uses speculative entries only).
	NATSURLs []string `yaml:"natsURLs"`
	// NATSAuth is the credentials and TLS for NATS (the same flags as every
	// command: natsutil.BindFlags). The ingress only subscribes to the delta
	// subjects and requests snapshots: it never creates or alters the
	// JetStream stream (the sidecars or the orchestrator own it), so a NATS
	// user without stream-admin rights is enough.
	NATSAuth natsutil.Auth `yaml:"natsAuth"`
	// StateOverNATSOff turns the NATS state lane off (statelane.go): with
	// gossip and NATS both on, engine load then reaches routing by gossip
	// alone. Default false (the lane runs).
	StateOverNATSOff bool `yaml:"stateOverNATSOff"`
	// IndexSyncGrace bounds how long /ready waits for the first index sync
	// (NATS reachable, every engine snapshotted). Past it the replica is
	// ready anyway and routes on load and its own speculative entries until
	// NATS answers (as Envoy proceeds after its initial_fetch_timeout), so a
	// NATS outage at start cannot keep every restarted replica out of
	// service. Default 30s; 0 waits for the sync forever.
	IndexSyncGrace time.Duration `yaml:"indexSyncGrace"`
}

func (c *ClusterConfig) problems(bad func(string, ...any)) {
	if c.GossipBind != "" {
		var gc gossip.Config
		if err := gc.SetAddrs(c.GossipBind, c.GossipAdvertise); err != nil {
			bad("%v", strings.ReplaceAll(err.Error(), "\n", "; "))
		}
	}
	if len(c.GossipSeeds) > 0 && c.GossipBind == "" {
		bad("gossip seeds given without a gossip bind address")
	}
	switch c.GossipProfile {
	case "", "local", "lan", "wan":
	default:
		bad("gossip profile %q: want local, lan or wan", c.GossipProfile)
	}
}

// stateSharer is the optional capability of a RateLimiter whose usage is
// shared cluster-wide through gossip (ingress/ratelimit implements it).
type stateSharer interface {
	AppendState(dst []byte, maxBytes int) []byte
	MergeState(origin string, b []byte) error
	ForgetOrigin(origin string)
}

const rateLimitAppState = "ratelimit"

// cluster owns the replica's gossip node, NATS connection and materializer.
type cluster struct {
	node *gossip.Node
	nc   *natsutil.Conn
	mat  *materialize.Materializer
	mem  *gossipMembership
	lane *stateLane // nil without NATS (statelane.go)
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// startCluster joins gossip and starts the materializer per cfg.Cluster.
// It is called from Start; s.deps.Membership already points at s.cl.mem.
func (s *Server) startCluster() error {
	cc := &s.cfg.Cluster
	cl := s.cl
	ctx, cancel := context.WithCancel(context.Background())
	cl.stop = cancel
	if cc.GossipBind != "" {
		gc := gossip.DefaultConfig()
		gc.Name = s.cfg.ID
		if err := gc.SetAddrs(cc.GossipBind, cc.GossipAdvertise); err != nil {
			return fmt.Errorf("ingress gossip: %w", err) // Validate has said so already
		}
		gc.Join = cc.GossipSeeds
		gc.SecretKey, gc.ExtraKeys = cc.GossipKey, cc.GossipKeys
		if cc.GossipProfile != "" {
			gc.Profile = cc.GossipProfile
		}
		gc.Meta = gossip.NodeMeta{Role: gossip.RoleIngress, ID: s.cfg.ID}
		gc.Logger = s.log
		gc.Registerer = s.deps.Registry
		gc.Relay = s.stateLaneRelay()
		node, err := gossip.New(gc)
		if err != nil {
			return fmt.Errorf("ingress gossip: %w", err)
		}
		cl.node = node
		s.slo = NewSLORecorder(DefaultSLOConfig())
		if cl.mem != nil {
			cl.mem.node.Store(node)
			cl.mem.refresh()
		}
		if sh, ok := s.deps.Limiter.(stateSharer); ok {
			node.OnAppState(func(origin, name string, blob []byte) {
				if name == rateLimitAppState {
					if err := sh.MergeState(origin, blob); err != nil {
						s.log.Debug("bad rate-limit state", "from", origin, "err", err)
					}
				}
			})
			node.OnLeave(sh.ForgetOrigin)
		}
		if s.learn != nil {
			s.learnShares = newLearnShares(s.deps.Registry, s.cfg.ID)
			node.OnAppState(func(origin, name string, blob []byte) {
				if name == LearnStateName {
					s.mergeLearnShare(origin, blob)
				}
			})
			node.OnLeave(s.learn.ForgetPeer)
		}
	}
	if len(cc.NATSURLs) > 0 {
		nc := natsutil.DefaultConfig()
		nc.URLs = cc.NATSURLs
		nc.Auth = cc.NATSAuth
		nc.Name = "kvmesh-ingress-" + s.cfg.ID
		nc.Stream.Disabled = true // read-only: never create or change the stream
		nc.WaitForServer = true   // started before NATS: serve, and index once it answers
		conn, err := natsutil.Connect(ctx, nc, s.log)
		if err != nil {
			return fmt.Errorf("ingress nats: %w", err)
		}
		cl.nc = conn
		s.startStateLane(ctx, conn)
		mc := materialize.DefaultConfig()
		mc.Conn = conn.NC
		mc.Subjects = conn.Subjects
		mc.Index = s.deps.Index
		if cl.node != nil {
			mc.Membership = cl.node
		}
		mc.Logger = s.deps.Logger.With("ingress", s.cfg.ID) // the materializer names its own component
		mc.Registerer = s.deps.Registry
		mat, err := materialize.New(mc)
		if err != nil {
			return fmt.Errorf("ingress materializer: %w", err)
		}
		cl.mat = mat
		cl.wg.Add(1)
		go func() {
			defer cl.wg.Done()
			if err := mat.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				s.log.Error("materializer stopped", "err", err)
			}
		}()
		if st, ok := s.deps.Tokenizers.(*StoreTokenizers); ok {
			cl.wg.Add(1)
			go func() { defer cl.wg.Done(); st.Run(ctx, conn) }()
		}
	}
	return nil
}

// share runs on the load loop: this replica's in-flight and rate-limit usage out.
func (s *Server) shareCluster(buf []byte) []byte {
	node := s.cl.node
	if node == nil {
		return buf
	}
	if sh, ok := s.deps.Limiter.(stateSharer); ok {
		// 1 KiB keeps the blob in UDP broadcasts (~250 ms to spread); the
		// limiter sends its busiest scopes first when not all fit.
		buf = sh.AppendState(buf[:0], 1024)
		if err := node.SetAppState(rateLimitAppState, buf); err != nil {
			s.log.Debug("share rate-limit state", "err", err)
		}
	}
	if s.slo != nil {
		if err := s.slo.Tick(time.Now(), node); err != nil {
			s.log.Debug("share SLO summary", "err", err)
		}
	}
	if s.learn != nil {
		blob, err := s.learnSh.share(time.Now(), s.learn)
		if err == nil && blob != nil {
			err = node.SetAppState(LearnStateName, blob)
		}
		if err != nil {
			s.log.Debug("share learned costs", "err", err)
		}
	}
	if s.cl.mem != nil {
		s.cl.mem.refresh()
	}
	return buf
}

func (cl *cluster) close() {
	if cl.stop != nil {
		cl.stop()
	}
	cl.wg.Wait()
	if cl.node != nil {
		_ = cl.node.Close()
	}
	if cl.nc != nil {
		cl.nc.Close()
	}
}

// gossipMembership is the Membership and LoadSharer over a gossip node. The
// engine list is rebuilt every load interval, so requests read a snapshot
// without locks or allocation.
type gossipMembership struct {
	node atomic.Pointer[gossip.Node]
	snap atomic.Pointer[[]EngineInfo]
	mu   sync.Mutex     // guards own, ownPrefill
	own  map[string]int // this replica's last shared in-flight counts
	// ownPrefill is this replica's last shared P/D prefill legs.
	ownPrefill map[string]gossip.PrefillLoad
}

var (
	_ Membership = (*gossipMembership)(nil)
	_ LoadSharer = (*gossipMembership)(nil)
)

func (g *gossipMembership) Engines(dst []EngineInfo) []EngineInfo {
	if p := g.snap.Load(); p != nil {
		return append(dst, *p...)
	}
	return dst
}

// ShareInFlight publishes this replica's counts (gossip copies the map).
func (g *gossipMembership) ShareInFlight(loads []EngineLoad) {
	node := g.node.Load()
	if node == nil {
		return
	}
	m := make(map[string]int, len(loads))
	var pf map[string]gossip.PrefillLoad
	for _, l := range loads {
		if l.InFlight > 0 {
			m[l.Engine] = l.InFlight
		}
		if l.PrefillLegs > 0 || l.PrefillQueued > 0 {
			if pf == nil {
				pf = map[string]gossip.PrefillLoad{}
			}
			pf[l.Engine] = gossip.PrefillLoad{Legs: l.PrefillLegs, Queued: l.PrefillQueued}
		}
	}
	node.SetLoads(m, pf)
	g.mu.Lock()
	g.own, g.ownPrefill = m, pf
	g.mu.Unlock()
}

// refresh rebuilds the engine snapshot; InFlight holds the other replicas'
// counts (the cluster sum minus what this replica last shared).
func (g *gossipMembership) refresh() {
	node := g.node.Load()
	if node == nil {
		return
	}
	views := node.Engines()
	inflight, prefill := node.InFlight(), node.PrefillLoads()
	g.mu.Lock()
	own, ownPF := g.own, g.ownPrefill
	g.mu.Unlock()
	out := make([]EngineInfo, 0, len(views))
	for _, v := range views {
		if v.URL == "" {
			continue
		}
		role, _ := scheduler.ParseRole(v.EngineRole)
		pf, opf := prefill[v.ID], ownPF[v.ID]
		queued := max(0, pf.Queued-opf.Queued)
		out = append(out, EngineInfo{
			Engine: scheduler.Engine{
				// Ready: the sidecar consumes the engine's events and its
				// last metrics scrapes answered (gossip/state.go).
				ID: v.ID, Healthy: v.Ready, Model: v.Model, Role: role,
				Running: v.Running, Waiting: v.Waiting, KVUsage: v.KVUsage, QueuedPrefillTokens: int(v.QueuedPrefill),
				// The engine's KV capacity (0: not reported, the terms
				// sized by it stay off: P/D's kvwait, llm-d's autotune).
				GPUBlocks: v.GPUBlocks,
				// Prefill legs queued at other replicas' admission will reach
				// the engine: they count as in flight there.
				InFlight:   max(0, inflight[v.ID]-own[v.ID]) + queued,
				Group:      v.Group,
				PDProtocol: v.PDProtocol,
				LoRAs:      v.Adapters(),
			},
			URL: v.URL, BlockSize: v.BlockSize, Bootstrap: v.Bootstrap,
			PrefillLegs: max(0, pf.Legs-opf.Legs), PrefillQueued: queued,
			MaxModelLen: v.MaxModelLen, Root: v.Root,
		})
	}
	g.snap.Store(&out)
}

// propagationLag is the largest propagation lag of the engines' last
// deltas, over the engines with a delta applied within the last
// materialize.LagWindow (an engine gone quiet keeps its last lag no
// longer than that).
func (cl *cluster) propagationLag() float64 {
	if cl.mat == nil {
		return 0
	}
	return cl.mat.PropagationLag(time.Now()).Seconds()
}

// GossipAddr is this replica's memberlist address ("" without gossip), for
// other members to join.
func (s *Server) GossipAddr() string {
	if s.cl == nil || s.cl.node == nil {
		return ""
	}
	return s.cl.node.Addr()
}
