package kvevents

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// MaxDPSize bounds the data-parallel ranks one subscriber (and one sidecar
// engine) follows: each rank has its own socket and state, so a mistyped
// size must be an error, not an allocation of that many.
const MaxDPSize = 1024

// SubscriberConfig configures the ZMQ subscriber of one engine and its DP
// ranks. Rank r's endpoints are rank 0's with the port offset by r
// (OffsetEndpoint), unless Endpoints/ReplayEndpoints list them explicitly.
type SubscriberConfig struct {
	// Endpoint is rank 0's PUB endpoint, e.g. "tcp://10.0.0.5:5557".
	Endpoint string
	// Endpoints lists every rank's endpoint explicitly (overrides Endpoint
	// and DPSize).
	Endpoints []string
	// Bind makes the SUB sockets bind their endpoints, for engines whose PUB
	// connects (a PUB endpoint without "*"). "tcp://127.0.0.1:*" binds a
	// random port: read the real ones from Subscriber.Endpoints.
	Bind bool
	// ReplayEndpoint is rank 0's ROUTER endpoint; "" means the engine has no
	// replay: every gap is reported as lost history.
	ReplayEndpoint  string
	ReplayEndpoints []string // explicit per-rank replay endpoints
	// DPSize is the number of DP ranks (default 1).
	DPSize int
	// Topic filters frame 0 by prefix (default "" = everything).
	Topic string
	// QueueSize bounds the hand-off queue of decoded batches to the
	// consumer (default 64). When it is full the socket loop blocks; ZMQ
	// then queues up to RcvHWM messages per rank (raw, far smaller than
	// decoded) and the engine's PUB drops beyond its own HWM, which the
	// subscriber later sees as a gap and repairs by replay. Nothing is
	// dropped silently. Each queued batch holds a decode slot (QueueSize+2
	// of them): a deep queue of decoded batches buys nothing ZMQ's own
	// buffer does not, and costs memory under long prompts (1,024 slots of
	// 2,000 evictions each: 620 MB).
	QueueSize int
	// RcvHWM is the SUB receive high-water mark (default 100000, vLLM's).
	RcvHWM int
	// ReplayTimeout bounds the silence within one replay exchange (default
	// 2s): no reply for this long ends it, and what was not replayed counts
	// as lost history.
	ReplayTimeout time.Duration
	// MaxReplayBatches bounds the replies read in one replay exchange
	// (default 1,000,000; vLLM buffers 10,000 batches by default): a replay
	// server that streams without end is cut off there, counted as a replay
	// failure, and what it did not deliver is lost history. Keep it above
	// the engine's buffer_steps.
	MaxReplayBatches int
	// ReplayOnStart requests every rank's replay buffer from seq 0 as soon
	// as the subscriber starts, so a sidecar (re)started next to an idle
	// engine learns its cache without waiting for the next event. Batches
	// also received live are recognised and skipped.
	ReplayOnStart bool
	// LiveStart makes each rank's first live batch the start of its
	// stream: the batches before it, still in the engine's replay buffer,
	// are not replayed (a tool watching live events, not one that must
	// know the engine's cache as a sidecar must). Idle probes leave a rank
	// alone until its first batch. Gaps after it, and an engine's new
	// incarnation, are replayed as usual. Not with ReplayOnStart.
	LiveStart bool
	// IdleProbe, when positive, replays a rank from its next seq after it
	// has been quiet this long (and again every IdleProbe while quiet): it
	// recovers batches lost at the end of a burst and notices an engine that
	// restarted and stayed idle. The first probe runs at start (like
	// ReplayOnStart). While replay exchanges fail in a row the interval
	// doubles per failure, up to a minute. Zero disables probes.
	IdleProbe time.Duration
	// PollInterval (default 50ms) is the shortest wait of the socket loop's
	// poll (up to a second when nothing is due; Close and Probe wake it at
	// once) and how often a replay's wait checks for Close; it bounds
	// neither message latency nor Close's outside a replay.
	PollInterval time.Duration
	// Logger (default slog.Default()).
	Logger *slog.Logger

	// loopHook, when set (tests only), runs on the socket loop at the top
	// of every round, before idle probes.
	loopHook func(*Subscriber)
}

// DefaultSubscriberConfig returns the defaults applied to zero fields.
func DefaultSubscriberConfig() SubscriberConfig {
	return SubscriberConfig{
		DPSize:           1,
		QueueSize:        64,
		RcvHWM:           100000,
		ReplayTimeout:    2 * time.Second,
		MaxReplayBatches: 1_000_000,
		PollInterval:     50 * time.Millisecond,
	}
}

func (c *SubscriberConfig) setDefaults() {
	d := DefaultSubscriberConfig()
	if c.DPSize == 0 {
		c.DPSize = d.DPSize
	}
	if c.QueueSize == 0 {
		c.QueueSize = d.QueueSize
	}
	if c.RcvHWM == 0 {
		c.RcvHWM = d.RcvHWM
	}
	if c.ReplayTimeout == 0 {
		c.ReplayTimeout = d.ReplayTimeout
	}
	if c.MaxReplayBatches == 0 {
		c.MaxReplayBatches = d.MaxReplayBatches
	}
	if c.PollInterval == 0 {
		c.PollInterval = d.PollInterval
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate lists every problem with the configuration.
func (c *SubscriberConfig) Validate() error {
	var errs []error
	if c.Endpoint == "" && len(c.Endpoints) == 0 {
		//lint:ignore ST1005 names the field
		errs = append(errs, errors.New("Endpoint is required"))
	}
	if c.DPSize < 0 || c.DPSize > MaxDPSize {
		errs = append(errs, fmt.Errorf("DPSize %d is out of range [0, %d]", c.DPSize, MaxDPSize))
	}
	if len(c.Endpoints) > 0 && c.ReplayEndpoint != "" && len(c.ReplayEndpoints) == 0 {
		errs = append(errs, errors.New("with Endpoints, list the replay endpoints in ReplayEndpoints"))
	}
	if len(c.ReplayEndpoints) > 0 && len(c.Endpoints) > 0 && len(c.ReplayEndpoints) != len(c.Endpoints) {
		errs = append(errs, fmt.Errorf("%d ReplayEndpoints for %d Endpoints", len(c.ReplayEndpoints), len(c.Endpoints)))
	}
	if c.QueueSize < 0 {
		errs = append(errs, fmt.Errorf("QueueSize %d is negative", c.QueueSize))
	}
	if c.RcvHWM < 0 {
		errs = append(errs, fmt.Errorf("RcvHWM %d is negative", c.RcvHWM))
	}
	if c.ReplayTimeout < 0 {
		errs = append(errs, fmt.Errorf("ReplayTimeout %v is negative", c.ReplayTimeout))
	}
	if c.MaxReplayBatches < 0 {
		errs = append(errs, fmt.Errorf("MaxReplayBatches %d is negative", c.MaxReplayBatches))
	}
	if c.IdleProbe < 0 {
		errs = append(errs, fmt.Errorf("IdleProbe %v is negative", c.IdleProbe))
	}
	if c.LiveStart && c.ReplayOnStart {
		errs = append(errs, errors.New("LiveStart and ReplayOnStart exclude each other: a stream starts at its first live batch or at 0"))
	}
	if c.PollInterval < 0 {
		errs = append(errs, fmt.Errorf("PollInterval %v is negative", c.PollInterval))
	}
	if len(c.Endpoints) == 0 && c.Endpoint != "" {
		for r := 0; r < max(c.DPSize, 1); r++ {
			if _, err := OffsetEndpoint(c.Endpoint, r); err != nil {
				//lint:ignore ST1005 names the field
				errs = append(errs, fmt.Errorf("Endpoint: %w", err))
				break
			}
		}
		if c.ReplayEndpoint != "" && len(c.ReplayEndpoints) == 0 {
			for r := 0; r < max(c.DPSize, 1); r++ {
				if _, err := OffsetEndpoint(c.ReplayEndpoint, r); err != nil {
					errs = append(errs, fmt.Errorf("ReplayEndpoint: %w", err))
					break
				}
			}
		}
	}
	for _, ep := range c.Endpoints {
		if _, err := OffsetEndpoint(ep, 0); err != nil {
			errs = append(errs, fmt.Errorf("Endpoints: %w", err))
		}
	}
	for _, ep := range c.ReplayEndpoints {
		if _, err := OffsetEndpoint(ep, 0); ep != "" && err != nil { // "" = no replay for that rank
			errs = append(errs, fmt.Errorf("ReplayEndpoints: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrConfig, errors.Join(errs...))
	}
	return nil
}

// rankEndpoints resolves each rank's (endpoint, replay endpoint).
func (c *SubscriberConfig) rankEndpoints() (eps, replays []string) {
	if len(c.Endpoints) > 0 {
		eps = c.Endpoints
		replays = make([]string, len(eps))
		copy(replays, c.ReplayEndpoints)
		return eps, replays
	}
	for r := 0; r < c.DPSize; r++ {
		ep, _ := OffsetEndpoint(c.Endpoint, r)
		eps = append(eps, ep)
		rep := ""
		switch {
		case r < len(c.ReplayEndpoints):
			rep = c.ReplayEndpoints[r]
		case c.ReplayEndpoint != "" && len(c.ReplayEndpoints) == 0:
			rep, _ = OffsetEndpoint(c.ReplayEndpoint, r)
		}
		replays = append(replays, rep)
	}
	return eps, replays
}
