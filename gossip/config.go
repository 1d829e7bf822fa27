package gossip

import (
	"encoding/base64"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Roles a node can have.
const (
	RoleSidecar      = "sidecar"
	RoleIngress      = "ingress"
	RoleOrchestrator = "orchestrator"
)

// Config configures one gossip member. Start from DefaultConfig.
type Config struct {
	// Name must be unique in the cluster. Default: hostname-random.
	Name string
	// BindAddr/BindPort: where memberlist listens (UDP and TCP). Default
	// 127.0.0.1 and 0 (a free port; the chosen one is Node.Port()).
	BindAddr string
	BindPort int
	// AdvertiseAddr/AdvertisePort: what others dial when it differs from the
	// bind address (NAT, pods). Empty/0: derived by memberlist (from a
	// private address of the host's when bound to 0.0.0.0; refused when bound
	// to [::] or an empty host, for which it would advertise ::).
	AdvertiseAddr string
	AdvertisePort int
	// Join lists seeds as "host:port"; a host may be a DNS name resolving to
	// several addresses (a Kubernetes headless Service). Empty: start a cluster.
	// Seeds are retried every RejoinInterval while this node is alone.
	Join []string
	// SecretKey enables AES-GCM encryption of all gossip; 16, 24 or 32 bytes.
	// Every member must share it; a member with another key cannot join.
	SecretKey []byte
	// ExtraKeys are further keys accepted for decryption, never used to
	// encrypt: the keyring for rotating SecretKey without a partition.
	// Rotation: give every member the new key as an extra key (or
	// InstallKey), then make it primary everywhere (UseKey), then drop the
	// old one (RemoveKey). Each must be 16, 24 or 32 bytes; needs SecretKey.
	ExtraKeys [][]byte
	// Profile picks memberlist timings: "local" (loopback/tests: probe 1s,
	// dead within ~3-5s), "lan" (default in production) or "wan".
	Profile string
	// Meta is this node's metadata (Contract 3); at most MetaLimit bytes
	// encoded (CheckMeta).
	Meta NodeMeta
	// BroadcastInterval is how often changed local state is queued for
	// gossip; unchanged state is re-broadcast every 10 intervals so late
	// joiners converge without waiting for a push/pull. Default 250ms.
	BroadcastInterval time.Duration
	// PushPullInterval is the full-state TCP sync period, which also carries
	// entries too large for a UDP broadcast. Default 2s.
	PushPullInterval time.Duration
	// RejoinInterval: how often seeds are retried while alone. Default 2s.
	// Every ten intervals, a node that is not alone joins the seeds at
	// which no member listens (a seed restarted without seeds of its own).
	// Joins run beside the broadcasts, never in their way.
	RejoinInterval time.Duration
	// Logger for membership changes; memberlist's own log goes here too:
	// its [ERR] and [WARN] lines at warn level (at most one a minute per
	// kind), the rest at debug.
	Logger *slog.Logger
	// Registerer for the kvmesh_gossip_* metrics; nil: not registered.
	Registerer prometheus.Registerer
	// Relay, when set, is also handed every own entry queued because it
	// changed (see Relay for its contract); receivers merge it with
	// Node.MergeRelayed. nil: gossip only.
	Relay Relay

	// versionNow, when set, replaces time.Now().UnixNano() as the source of
	// own entries' versions (tests: a member restarted on a clock behind
	// its predecessor's).
	versionNow func() int64
	// aloneWarnEvery, when set, replaces aloneWarnEvery (a minute) as the
	// period of the warning of a member alone (tests).
	aloneWarnEvery time.Duration
	// noGeneration makes the member advertise and tag no generation, as a
	// member that predates them does (tests of mixed versions).
	noGeneration bool
}

// NodeMeta is the node metadata of Contract 3. A DaemonSet sidecar with several
// engines puts its first engine here and every engine in its EngineState.
type NodeMeta struct {
	Role       string `json:"role"`
	ID         string `json:"id"`
	Model      string `json:"model,omitempty"`
	EngineURL  string `json:"url,omitempty"`
	EngineRole string `json:"erole,omitempty"` // prefill, decode, mixed
	DPRank     int    `json:"dp,omitempty"`
	BlockSize  int    `json:"bs,omitempty"`
	Epoch      uint64 `json:"ep,omitempty"`
	// Gen is the member's generation: a random number drawn at every
	// process start (New replaces any value given), so a member restarted
	// under the same name advertises a new one. Receivers accept a member's
	// state entries only of the generation its metadata advertises
	// (generation.go). Memberlist orders metadata by its incarnation
	// numbers, which a live member raises to refute an older claim, not by
	// a clock. 0: none (a member that predates generations).
	Gen uint64 `json:"g,omitempty"`
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		BindAddr:          "127.0.0.1",
		Profile:           "lan",
		BroadcastInterval: 250 * time.Millisecond,
		PushPullInterval:  2 * time.Second,
		RejoinInterval:    2 * time.Second,
	}
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("invalid gossip config")

// Validate lists every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	if c.BindPort < 0 || c.BindPort > 65535 {
		add("bind port %d out of range", c.BindPort)
	}
	if c.AdvertisePort < 0 || c.AdvertisePort > 65535 {
		add("advertise port %d out of range", c.AdvertisePort)
	}
	if why := unspecifiedAdvertise(c.BindAddr, c.AdvertiseAddr); why != "" {
		add("%s", why)
	}
	switch len(c.SecretKey) {
	case 0, 16, 24, 32:
	default:
		add("secret key is %d bytes; want 16, 24 or 32", len(c.SecretKey))
	}
	for i, k := range c.ExtraKeys {
		if l := len(k); l != 16 && l != 24 && l != 32 {
			add("extra key %d is %d bytes; want 16, 24 or 32", i, l)
		}
	}
	if len(c.ExtraKeys) > 0 && len(c.SecretKey) == 0 {
		add("extra keys need a secret key")
	}
	switch c.Profile {
	case "local", "lan", "wan":
	default:
		add("profile %q; want local, lan or wan", c.Profile)
	}
	switch c.Meta.Role {
	case RoleSidecar, RoleIngress, RoleOrchestrator:
	default:
		add("meta role %q; want sidecar, ingress or orchestrator", c.Meta.Role)
	}
	if c.BroadcastInterval <= 0 {
		add("broadcast interval %v must be positive", c.BroadcastInterval)
	}
	if c.PushPullInterval <= 0 {
		add("push/pull interval %v must be positive", c.PushPullInterval)
	}
	if c.RejoinInterval <= 0 {
		add("rejoin interval %v must be positive", c.RejoinInterval)
	}
	if err := CheckMeta(c.Meta); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// CheckMeta says whether m fits memberlist's node metadata once encoded
// (MetaLimit bytes). When it does not, the error (wrapping ErrConfig) names
// the fields that take the room with their sizes, longest first: a DaemonSet
// sidecar checks every engine's metadata this way, not only the first's.
func CheckMeta(m NodeMeta) error {
	m.Gen = math.MaxUint64 // New sets a random one: leave room for the longest
	b, err := encodeMeta(m)
	if err != nil {
		return fmt.Errorf("%w: meta: %w", ErrConfig, err)
	}
	if len(b) <= MetaLimit {
		return nil
	}
	type field struct {
		name string
		n    int
	}
	var fs []field
	for _, f := range []field{{"model", len(m.Model)}, {"url", len(m.EngineURL)}, {"id", len(m.ID)}, {"engine role", len(m.EngineRole)}} {
		if f.n > 0 {
			fs = append(fs, f)
		}
	}
	slices.SortStableFunc(fs, func(a, b field) int { return b.n - a.n })
	parts := make([]string, len(fs))
	for i, f := range fs {
		parts[i] = fmt.Sprintf("%s %d bytes", f.name, f.n)
	}
	return fmt.Errorf("%w: gossip metadata of %q encodes to %d bytes with its generation, limit %d (%s): shorten the model name, engine URL or id by %d bytes",
		ErrConfig, m.ID, len(b), MetaLimit, strings.Join(parts, ", "), len(b)-MetaLimit)
}

// ParseKeys parses the --gossip-key form: comma-separated base64 keys, the
// first the primary (encrypts), the rest extra keys (decrypt only, for
// rotation). Empty input is no encryption.
func ParseKeys(s string) (primary []byte, extra [][]byte, err error) {
	for i, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		k, derr := base64.StdEncoding.DecodeString(part)
		if derr != nil || (len(k) != 16 && len(k) != 24 && len(k) != 32) {
			return nil, nil, fmt.Errorf("gossip key %d: want base64 of 16, 24 or 32 bytes", i)
		}
		if primary == nil {
			primary = k
		} else {
			extra = append(extra, k)
		}
	}
	return primary, extra, nil
}

// unspecifiedAdvertise says why the member would advertise an address no
// peer can dial ("" when it would not): an advertise address that is
// unspecified (0.0.0.0, ::), or none beside a bind on every address other
// than 0.0.0.0 ([::] or an empty host), for which memberlist advertises the
// listener's own address, ::, and peers that dial it dial themselves. Bound
// to 0.0.0.0 without one, memberlist picks a private (RFC 6890) address
// of the host's, and fails at start when it has none.
func unspecifiedAdvertise(bind, advertise string) string {
	const fix = "give the address peers dial (--gossip-advertise; in a pod its IP, $(POD_IP))"
	if advertise != "" {
		if ip := net.ParseIP(advertise); ip != nil && ip.IsUnspecified() {
			return fmt.Sprintf("advertise address %s is no address a peer can dial; %s", advertise, fix)
		}
		return ""
	}
	if bind == "0.0.0.0" {
		return ""
	}
	if ip := net.ParseIP(bind); bind == "" || ip != nil && ip.IsUnspecified() {
		return fmt.Sprintf("bind address %q listens on every address, and memberlist would advertise ::, which peers cannot dial; %s", bind, fix)
	}
	return ""
}
