package report

// RunInfo is a `kvmesh bench --json` report's "run" header: what ran, so a
// saved report can be tied to its run and rerun. Every field is always
// present; one the kind of run does not read is null (docs/BENCHMARKS.md,
// "`kvmesh bench --json`").
type RunInfo struct {
	// Mode is "des" or "live"; Kind "aggregated", "pd" (--roles) or
	// "autoscale".
	Mode string `json:"mode"`
	Kind string `json:"kind"`
	// Engines is the engine (GPU) count; Roles the P/D split
	// ("prefill=N,decode=M,mixed=K"; the starting one in autoscaling runs).
	Engines int     `json:"engines"`
	Roles   *string `json:"roles"`
	// Profile is the engines' timing profile's name, ProfileFile the file
	// it came from (--profile-file).
	Profile     string  `json:"profile"`
	ProfileFile *string `json:"profile_file"`
	// The engines' KV cache and batch limits, as run (defaults filled).
	BlockSize      int `json:"block_size"`
	GPUBlocks      int `json:"gpu_blocks"`
	CPUBlocks      int `json:"cpu_blocks"`
	MaxRunning     int `json:"max_running"`
	MaxBatchTokens int `json:"max_batch_tokens"`
	// Seed seeds the workload and the schedulers.
	Seed uint64 `json:"seed"`
	// Policies are the policies (or autoscalers) compared, in run order.
	Policies []string `json:"policies"`
	// Config is the SchedulerConfig file (--config).
	Config *string `json:"config"`
	// Concurrency is the client's cap on requests in flight (0: none).
	Concurrency int `json:"concurrency"`
	// DES only: the KV event delay and the load snapshot interval
	// (negative: always fresh), seconds.
	EventDelay       *float64 `json:"event_delay_s"`
	SnapshotInterval *float64 `json:"snapshot_interval_s"`
	// Live only: the engines' speed-up over real time and the ingresses.
	TimeScale *float64 `json:"time_scale"`
	Ingresses *int     `json:"ingresses"`
	// P/D only: the KV transfer's bandwidth and fixed cost, as run.
	TransferGbps  *float64 `json:"transfer_gbps"`
	TransferSetup *float64 `json:"transfer_setup_s"`
	Workload      Workload `json:"workload"`
}

// Workload is RunInfo's workload: its options (null when the kind does
// not read them) and what it came to.
type Workload struct {
	// Kind is --workload's value (autoscaling runs: their shape,
	// "diurnal" or "bursty").
	Kind string `json:"kind"`
	// Trace is the trace file (trace, bailian, azure, sharegpt).
	Trace *string `json:"trace"`
	// Shared-prefix: groups of prompts sharing a prefix, the prompt's
	// shared and own tokens, the output tokens and the Poisson rate
	// (requests/s, 0: all at once).
	Groups   *int     `json:"groups"`
	Prompts  *int     `json:"prompts"`
	Shared   *int     `json:"shared"`
	Question *int     `json:"question"`
	Output   *int     `json:"output"`
	Rate     *float64 `json:"rate"`
	// Every other workload: the arrival rate multiplier and the first
	// requests kept (0: all).
	RateScale *float64 `json:"rate_scale"`
	Limit     *int     `json:"limit"`
	// What the workload came to: requests, their prompt and output tokens,
	// the last arrival (seconds), and the trace rows with output_length 0
	// sent as 1 token.
	Requests       int     `json:"requests"`
	PromptTokens   int     `json:"prompt_tokens"`
	OutputTokens   int     `json:"output_tokens"`
	Arrivals       float64 `json:"arrivals_s"`
	ZeroOutputRows int     `json:"zero_output_rows"`
}

// Ptr is &v: RunInfo's optional fields.
func Ptr[T any](v T) *T { return &v }
