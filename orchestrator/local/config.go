package local

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
)

// Config configures the local backend. Start from DefaultConfig.
type Config struct {
	// File is the multi-document YAML with ModelDeployments and
	// AutoscalingPolicies. It is re-read when it changes; a file that no
	// longer parses is logged and the last good one kept.
	File string
	// Exe is the kvmesh binary the children run. Default: this process's
	// own executable (os.Executable), so `kvmesh orchestrator --local`
	// runs its own version of `kvmesh sim` and `kvmesh sidecar`.
	Exe string
	// NATSURL is the NATS the sidecars and ingress use. Empty: an embedded
	// server on a free loopback port, stopped with the orchestrator.
	NATSURL string
	// GossipKey is the base64 gossip key, passed to the children through
	// the environment (KVMESH_GOSSIP_KEY), never on a command line. Empty:
	// unencrypted gossip (loopback only).
	GossipKey string
	// Ingress starts a `kvmesh ingress` child in front of the engines (a
	// ModelDeployment annotated kvmesh.io/local-ingress: "true" asks too).
	Ingress bool
	// IngressListen is the ingress's client address. Default 127.0.0.1:0
	// (a free port; Status.Ingress has the one chosen).
	IngressListen string
	// IngressArgs are extra `kvmesh ingress` flags.
	IngressArgs []string
	// PDPolicy is the ingress's --pd-policy when a deployment has prefill
	// or decode roles. Default "kvmesh".
	PDPolicy string
	// Interval is how often crashed children are recovered, the file is
	// re-read, every AutoscalingPolicy is stepped and the status written.
	// Default 2s.
	Interval time.Duration
	// StartTimeout bounds a child's start (a sim reporting its ports, the
	// ingress its address). Default 30s.
	StartTimeout time.Duration
	// StopTimeout is the SIGTERM-to-SIGKILL grace of one child. Default 10s.
	StopTimeout time.Duration
	// DrainTimeout bounds how long a scaled-down engine may finish what it
	// runs after leaving the mesh. Default 30s.
	DrainTimeout time.Duration
	// StatusFile, when set, is rewritten (atomically) with the JSON Status
	// after every step.
	StatusFile string
	// OnStatus, when set, is called with the Status after every step from
	// the loop goroutine; it must not block for long.
	OnStatus func(Status)
	// ChildStderr receives the children's logs. Nil: discarded.
	ChildStderr io.Writer
	// SLO, when true, scrapes the engines' /metrics each step for the SLO
	// mode's inputs (prompt tokens/s on prefill roles, TTFT and TPOT p90).
	// Default true: the local backend owns the engines and may read them.
	SLO bool
	// Logger for the orchestrator's own messages. Default: discard.
	Logger *slog.Logger
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{IngressListen: "127.0.0.1:0", PDPolicy: "kvmesh", Interval: 2 * time.Second,
		StartTimeout: 30 * time.Second, StopTimeout: 10 * time.Second, DrainTimeout: 30 * time.Second, SLO: true}
}

// ErrConfig wraps every configuration problem.
var ErrConfig = errors.New("invalid local orchestrator config")

// Validate lists every problem and fills Exe and Logger when empty.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...))
	}
	if c.File == "" {
		add("no spec file")
	}
	if c.Exe == "" {
		exe, err := os.Executable()
		if err != nil {
			add("own executable: %v", err)
		}
		c.Exe = exe
	}
	if c.Interval <= 0 || c.StartTimeout <= 0 || c.StopTimeout <= 0 || c.DrainTimeout <= 0 {
		add("interval, start, stop and drain timeouts must be positive")
	}
	if c.IngressListen == "" {
		add("empty ingress listen address")
	}
	if _, _, err := gossip.ParseKeys(c.GossipKey); err != nil {
		add("%v", err)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return errors.Join(errs...)
}
