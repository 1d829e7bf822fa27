package sim

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// KVTransferConfig is vLLM's --kv-transfer-config JSON, decoded strictly:
// an unknown key or connector fails at start, as vLLM's own dataclass does.
// Only NixlConnector is simulated.
type KVTransferConfig struct {
	KVConnector            string         `json:"kv_connector"`
	KVRole                 string         `json:"kv_role"`
	EngineID               string         `json:"engine_id,omitempty"`
	KVBufferDevice         string         `json:"kv_buffer_device,omitempty"`
	KVBufferSize           float64        `json:"kv_buffer_size,omitempty"`
	KVRank                 *int           `json:"kv_rank,omitempty"`
	KVParallelSize         int            `json:"kv_parallel_size,omitempty"`
	KVIP                   string         `json:"kv_ip,omitempty"`
	KVPort                 int            `json:"kv_port,omitempty"`
	KVConnectorExtraConfig map[string]any `json:"kv_connector_extra_config,omitempty"`
	KVConnectorModulePath  string         `json:"kv_connector_module_path,omitempty"`
	EnablePermuteLocalKV   bool           `json:"enable_permute_local_kv,omitempty"`
	KVLoadFailurePolicy    string         `json:"kv_load_failure_policy,omitempty"`
}

// ParseKVTransferConfig decodes and validates a --kv-transfer-config value.
func ParseKVTransferConfig(s string) (*KVTransferConfig, error) {
	dec := json.NewDecoder(bytes.NewReader([]byte(s)))
	dec.DisallowUnknownFields()
	var c KVTransferConfig
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("%w: kv transfer config: %w", ErrInvalidConfig, err)
	}
	if openai.TrailingData(dec) {
		return nil, fmt.Errorf("%w: kv transfer config: trailing data", ErrInvalidConfig)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// Validate lists every problem with c.
func (c *KVTransferConfig) Validate() error {
	var errs []error
	switch c.KVConnector {
	case "NixlConnector":
	case "":
		errs = append(errs, errors.New("kv_connector: required"))
	default:
		errs = append(errs, fmt.Errorf("kv_connector %q: the simulator implements only NixlConnector", c.KVConnector))
	}
	switch c.KVRole {
	case "kv_both", "kv_producer", "kv_consumer":
	case "":
		errs = append(errs, errors.New("kv_role: required (kv_both, kv_producer or kv_consumer)"))
	default:
		errs = append(errs, fmt.Errorf("kv_role %q: want kv_both, kv_producer or kv_consumer", c.KVRole))
	}
	switch c.KVLoadFailurePolicy {
	case "", "recompute":
	default:
		errs = append(errs, fmt.Errorf("kv_load_failure_policy %q: the simulator implements only recompute", c.KVLoadFailurePolicy))
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: kv transfer config: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}

// PDConfig configures prefill/decode disaggregation: vLLM's NIXL protocol
// (KVTransfer set) or SGLang's bootstrap protocol (DisaggregationMode set),
// never both. The zero value disables both.
type PDConfig struct {
	// KVTransfer enables vLLM's NixlConnector protocol (--kv-transfer-config).
	// As in vLLM the role of each request comes from its kv_transfer_params;
	// kv_producer engines never read remote KV and kv_consumer engines never
	// hold blocks for a remote decode.
	KVTransfer *KVTransferConfig
	// SideChannelHost is the side channel's listen host and the remote_host a
	// prefill reports (VLLM_NIXL_SIDE_CHANNEL_HOST). Default "127.0.0.1"
	// (vLLM's is "localhost"; the CLI uses it).
	SideChannelHost string
	// SideChannelPort is rank 0's side-channel port; rank r listens on
	// port+r (VLLM_NIXL_SIDE_CHANNEL_PORT + data-parallel rank). 0 picks a
	// free port per rank (tests); the CLI defaults to vLLM's 5600.
	SideChannelPort int
	// EngineID is the remote_engine_id a prefill reports (kv_transfer_config
	// engine_id, else a random id per process as vLLM's uuid4); rank r of
	// DP > 1 appends "_dp<r>".
	EngineID string
	// TransferGbps is the modelled KV-transfer bandwidth in gigabits per
	// second (10⁹ bit/s): a read of n blocks takes n × block bytes × 8 ÷
	// (TransferGbps × 10⁹) modelled seconds. Default 100 (one 100 GbE / HDR
	// InfiniBand link per GPU pair).
	TransferGbps float64
	// AbortTimeout frees held blocks nobody read (VLLM_NIXL_ABORT_REQUEST_TIMEOUT,
	// default 480 s). Wall time, not modelled time: it is an operational
	// timeout, not GPU work.
	AbortTimeout time.Duration
	// TPSize is the tp_size a prefill reports. Default 1.
	TPSize int

	// DisaggregationMode is SGLang's --disaggregation-mode: "" (off),
	// "prefill" or "decode".
	DisaggregationMode string
	// BootstrapAddr is where a prefill-mode engine listens for decode
	// engines (SGLang's bootstrap server, --disaggregation-bootstrap-port,
	// default 8998). Default "127.0.0.1:0" (a free port; the CLI uses the
	// HTTP host and port 8998).
	BootstrapAddr string
	// BootstrapTimeout bounds how long a decode waits for its room's KV
	// (SGLang's SGLANG_DISAGGREGATION_WAITING_TIMEOUT). Default 300 s, wall time.
	BootstrapTimeout time.Duration
}

// Enabled reports whether any P/D protocol is on.
func (c *PDConfig) Enabled() bool { return c.KVTransfer != nil || c.DisaggregationMode != "" }

// defaults fills zero fields.
func (c PDConfig) defaults() PDConfig {
	if c.SideChannelHost == "" {
		c.SideChannelHost = "127.0.0.1"
	}
	if c.EngineID == "" && c.KVTransfer != nil {
		c.EngineID = c.KVTransfer.EngineID
	}
	if c.EngineID == "" {
		c.EngineID = randomEngineID()
	}
	if c.TransferGbps == 0 {
		c.TransferGbps = 100
	}
	if c.AbortTimeout == 0 {
		c.AbortTimeout = 480 * time.Second
	}
	if c.TPSize == 0 {
		c.TPSize = 1
	}
	if c.BootstrapAddr == "" {
		c.BootstrapAddr = "127.0.0.1:0"
	}
	if c.BootstrapTimeout == 0 {
		c.BootstrapTimeout = 300 * time.Second
	}
	return c
}

// validate lists every problem with c (after defaults).
func (c *PDConfig) validate(dp int) []error {
	if !c.Enabled() {
		return nil
	}
	var errs []error
	if c.KVTransfer != nil {
		if err := c.KVTransfer.Validate(); err != nil {
			errs = append(errs, err)
		}
	}
	switch c.DisaggregationMode {
	case "", "prefill", "decode":
	default:
		errs = append(errs, fmt.Errorf("disaggregation mode %q: want prefill or decode", c.DisaggregationMode))
	}
	if c.KVTransfer != nil && c.DisaggregationMode != "" {
		errs = append(errs, errors.New("kv transfer config (vLLM NIXL) and disaggregation mode (SGLang) are exclusive"))
	}
	if c.SideChannelPort < 0 || c.SideChannelPort+dp-1 > 65535 {
		errs = append(errs, fmt.Errorf("side channel port %d: want 0..%d", c.SideChannelPort, 65536-dp))
	}
	if !(c.TransferGbps > 0) || math.IsInf(c.TransferGbps, 0) { // NaN fails > 0
		errs = append(errs, fmt.Errorf("kv transfer gbps %g: want > 0", c.TransferGbps))
	}
	if c.AbortTimeout < 0 || c.BootstrapTimeout < 0 {
		errs = append(errs, errors.New("abort and bootstrap timeouts must be positive"))
	}
	if c.TPSize < 1 {
		errs = append(errs, fmt.Errorf("tp size %d: want ≥ 1", c.TPSize))
	}
	if c.DisaggregationMode == "prefill" {
		if _, _, err := net.SplitHostPort(c.BootstrapAddr); err != nil {
			errs = append(errs, fmt.Errorf("bootstrap address %q: %w", c.BootstrapAddr, err))
		}
	}
	return errs
}

// engineID is rank r's engine id.
func (c *PDConfig) engineID(r, dp int) string {
	if dp > 1 {
		return c.EngineID + "_dp" + strconv.Itoa(r)
	}
	return c.EngineID
}

// BindPDFlags registers the P/D flags of `kvmesh sim` on fs; Build applies
// them (with vLLM's environment variables VLLM_NIXL_SIDE_CHANNEL_HOST/_PORT
// and VLLM_NIXL_ABORT_REQUEST_TIMEOUT as defaults) onto Config.PD. A bad
// --kv-transfer-config or --nixl-side-channel fails at parse time.
func (o *Options) BindPDFlags(fs *flag.FlagSet) {
	var f struct {
		kv         *KVTransferConfig
		host       string
		port       int
		sideSet    bool
		gbps       float64
		abort      time.Duration
		mode       string
		bootPort   int
		bootWait   time.Duration
		abortIsSet func() bool
	}
	fs.Func("kv-transfer-config", `vLLM KV connector JSON, e.g. '{"kv_connector":"NixlConnector","kv_role":"kv_both"}' (enables the NIXL P/D protocol)`, func(s string) error {
		kc, err := ParseKVTransferConfig(s)
		f.kv = kc
		return err
	})
	fs.Func("nixl-side-channel", "HOST:PORT of the NIXL side channel, rank r uses PORT+r, port 0 = free ports (default $VLLM_NIXL_SIDE_CHANNEL_HOST:$VLLM_NIXL_SIDE_CHANNEL_PORT, else localhost:5600)", func(s string) error {
		h, p, err := net.SplitHostPort(s)
		if err != nil {
			return err
		}
		port, err := strconv.Atoi(p)
		if err != nil || port < 0 || port > 65535 {
			return fmt.Errorf("port %q: want 0..65535", p)
		}
		f.host, f.port, f.sideSet = h, port, true
		return nil
	})
	fs.Float64Var(&f.gbps, "kv-transfer-gbps", 100, "modelled KV-transfer bandwidth between engines, gigabits per second")
	fs.DurationVar(&f.abort, "nixl-abort-timeout", 480*time.Second, "free held prefill blocks nobody read after this, wall time (default $VLLM_NIXL_ABORT_REQUEST_TIMEOUT seconds, else 480s)")
	fs.StringVar(&f.mode, "disaggregation-mode", "", "SGLang P/D mode: prefill or decode (empty = off)")
	fs.IntVar(&f.bootPort, "disaggregation-bootstrap-port", 8998, "SGLang bootstrap port of a prefill-mode engine (listens on the --http host)")
	fs.DurationVar(&f.bootWait, "disaggregation-timeout", 300*time.Second, "how long a decode-mode engine waits for its bootstrap room's KV, wall time")
	f.abortIsSet = func() bool { return flagSet(fs, "nixl-abort-timeout") }
	o.pdFinish = func(c *PDConfig, httpAddr string) error {
		var errs []error
		c.KVTransfer, c.TransferGbps, c.AbortTimeout = f.kv, f.gbps, f.abort
		c.DisaggregationMode, c.BootstrapTimeout = f.mode, f.bootWait
		c.SideChannelHost, c.SideChannelPort = envOr("VLLM_NIXL_SIDE_CHANNEL_HOST", "localhost"), 5600
		if v := os.Getenv("VLLM_NIXL_SIDE_CHANNEL_PORT"); v != "" {
			p, err := strconv.Atoi(v)
			if err != nil || p < 0 || p > 65535 {
				errs = append(errs, fmt.Errorf("VLLM_NIXL_SIDE_CHANNEL_PORT %q: want 0..65535", v))
			}
			c.SideChannelPort = p
		}
		if f.sideSet {
			c.SideChannelHost, c.SideChannelPort = f.host, f.port
		}
		if v := os.Getenv("VLLM_NIXL_ABORT_REQUEST_TIMEOUT"); v != "" && !f.abortIsSet() {
			sec, err := strconv.ParseFloat(v, 64)
			if err != nil || sec <= 0 {
				errs = append(errs, fmt.Errorf("VLLM_NIXL_ABORT_REQUEST_TIMEOUT %q: want seconds > 0", v))
			}
			c.AbortTimeout = time.Duration(sec * float64(time.Second))
		}
		host, _, err := net.SplitHostPort(httpAddr)
		if err != nil || host == "" {
			host = "127.0.0.1"
		}
		c.BootstrapAddr = net.JoinHostPort(host, strconv.Itoa(f.bootPort))
		return errors.Join(errs...)
	}
}

func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) { set = set || f.Name == name })
	return set
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// randomEngineID is a fresh engine id (vLLM uses a uuid4 per engine).
func randomEngineID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", b[0:4], b[4:6], b[6:8], b[8:10], b[10:16])
}
