package epp

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The names of the Endpoint Picker Protocol (GAIE v1,
// docs/proposals/004-endpoint-picker-protocol).
const (
	DestinationKey    = "x-gateway-destination-endpoint"        // header and envoy.lb metadata key
	SubsetKey         = "x-gateway-destination-endpoint-subset" // request metadata key (subset hint)
	ServedKey         = "x-gateway-destination-endpoint-served" // response metadata key
	LBNamespace       = "envoy.lb"
	SubsetNamespace   = "envoy.lb.subset_hint"
	PrefillerHeader   = "x-prefiller-host-port" // llm-d routing sidecar: where to prefill first
	ExtProcService    = "envoy.service.ext_proc.v3.ExternalProcessor"
	HealthLiveness    = "liveness"
	HealthReadiness   = "readiness"
	defaultGRPCListen = ":9002"
)

// Body modes the picker can be configured to assume when the gateway does
// not send ext_proc's protocol_config (Envoy before 1.35).
const (
	ModeFullDuplex = "full-duplex" // FULL_DUPLEX_STREAMED: what GAIE gateways configure
	ModeBuffered   = "buffered"    // BUFFERED
	ModeStreamed   = "streamed"    // STREAMED with send_body_without_waiting_for_header_response
)

// Config is the picker's configuration. DefaultConfig fills every field;
// Validate lists every problem at once.
type Config struct {
	// Listen is the gRPC address for ext_proc and gRPC health (GAIE's
	// convention is port 9002).
	Listen string `yaml:"listen"`
	// DefaultBodyMode is the request body mode assumed when the gateway does
	// not say (no protocol_config on the stream's first message). A wrong
	// guess deadlocks until the gateway's message timeout, so gateways that
	// send protocol_config always win.
	DefaultBodyMode string `yaml:"defaultBodyMode"`
	// MaxBodyBytes bounds the request body the picker buffers (413 above).
	// Zero: 16 MiB.
	MaxBodyBytes int `yaml:"maxBodyBytes"`
	// MaxEndpoints bounds the fallback list sent to the gateway (the data
	// plane retries down it). Zero: 4.
	MaxEndpoints int `yaml:"maxEndpoints"`
	// PD configures prefill/decode disaggregation through llm-d's routing
	// sidecar header; the zero value turns it off.
	PD PDConfig `yaml:"pd"`
	// TLS is how the ext_proc listener is secured: self-signed (default,
	// what GAIE gateways expect), files (TLSCertFile/TLSKeyFile) or off.
	TLS         string `yaml:"tls"`
	TLSCertFile string `yaml:"tlsCertFile"`
	TLSKeyFile  string `yaml:"tlsKeyFile"`
	// ReadyInterval is how often readiness is re-evaluated for the gRPC
	// health service. Zero: 500 ms.
	ReadyInterval time.Duration `yaml:"readyInterval"`
	// DrainDelay is how long Close keeps serving after readiness turns
	// NOT_SERVING, before it stops taking streams: the time the gateway needs
	// to learn the pod is leaving (its EndpointSlice update, the gateway's
	// own health checks), during which new streams still arrive here and
	// are answered. DefaultConfig: 5s; zero: none.
	DrainDelay time.Duration `yaml:"drainDelay"`

	Logger     *slog.Logger          `yaml:"-"` // nil: slog.Default()
	Registerer prometheus.Registerer `yaml:"-"` // nil: no metrics registered
}

// DefaultConfig is a picker on :9002 for GAIE's FULL_DUPLEX_STREAMED mode.
func DefaultConfig() Config {
	return Config{
		Listen:          defaultGRPCListen,
		DefaultBodyMode: ModeFullDuplex,
		MaxBodyBytes:    16 << 20,
		MaxEndpoints:    4,
		PD:              DefaultPDConfig(),
		ReadyInterval:   500 * time.Millisecond,
		DrainDelay:      5 * time.Second,
		TLS:             TLSSelfSigned,
	}
}

// Validate reports every problem in c.
func (c *Config) Validate() error {
	var probs []string
	bad := func(f string, a ...any) { probs = append(probs, fmt.Sprintf(f, a...)) }
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		bad("--grpc %q: want host:port, IPv6 in brackets ([::1]:9002): %v", c.Listen, err) // not --listen, the HTTP listener's flag
	}
	switch c.DefaultBodyMode {
	case ModeFullDuplex, ModeBuffered, ModeStreamed:
	default:
		bad("defaultBodyMode %q: want %s, %s or %s", c.DefaultBodyMode, ModeFullDuplex, ModeBuffered, ModeStreamed)
	}
	if c.MaxBodyBytes < 0 {
		bad("maxBodyBytes must be >= 0, got %d", c.MaxBodyBytes)
	}
	if c.MaxEndpoints < 0 {
		bad("maxEndpoints must be >= 0, got %d", c.MaxEndpoints)
	}
	if c.ReadyInterval < 0 {
		bad("readyInterval must be >= 0")
	}
	if c.DrainDelay < 0 {
		bad("drainDelay must be >= 0")
	}
	switch c.TLS {
	case TLSSelfSigned, TLSOff:
	case TLSFiles:
		if c.TLSCertFile == "" || c.TLSKeyFile == "" {
			bad("--grpc-tls=%s needs --grpc-tls-cert and --grpc-tls-key", c.TLS)
		}
	default:
		bad("tls %q: want %s, %s or %s", c.TLS, TLSSelfSigned, TLSFiles, TLSOff)
	}
	c.PD.problems(bad)
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", ErrConfig, strings.Join(probs, "; "))
	}
	return nil
}

// ErrConfig wraps every configuration problem.
var ErrConfig = errors.New("epp config")

func (c *Config) withDefaults() {
	d := DefaultConfig()
	if c.Listen == "" {
		c.Listen = d.Listen
	}
	if c.DefaultBodyMode == "" {
		c.DefaultBodyMode = d.DefaultBodyMode
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = d.MaxBodyBytes
	}
	if c.MaxEndpoints == 0 {
		c.MaxEndpoints = d.MaxEndpoints
	}
	if c.ReadyInterval == 0 {
		c.ReadyInterval = d.ReadyInterval
	}
	if c.TLS == "" {
		c.TLS = d.TLS
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}
