package engine

import (
	"cmp"
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	ErrInvalidConfig  = errors.New("engine: invalid config")
	ErrUnknownProfile = errors.New("engine: unknown profile")
	ErrBadRequest     = errors.New("engine: bad request")
	ErrDuplicateID    = errors.New("engine: duplicate request id")
	ErrTooLong        = errors.New("engine: request longer than the KV cache or max model length")
	ErrBusy           = errors.New("engine: blocks in use")
)

// Config configures one engine. The zero value of every field means "default"
// (see Defaults) except where noted.
type Config struct {
	// BlockSize is tokens per KV block (vLLM --block-size). Default 16.
	BlockSize int
	// GPUBlocks is the GPU KV capacity in blocks. Default 4096 (65,536 tokens at 16).
	GPUBlocks int
	// CPUBlocks is the CPU tier's capacity in blocks; 0 disables the tier.
	// Blocks evicted from the GPU move there and are reported with medium "CPU";
	// prefix hits there are loaded back over HostBW instead of recomputed.
	CPUBlocks int
	// MaxRunning is the largest batch in sequences (vLLM --max-num-seqs).
	// Default: the profile's MaxNumSeqs (vLLM's default on its GPU), else 256.
	MaxRunning int
	// MaxBatchTokens is the token budget per step (vLLM --max-num-batched-tokens);
	// prompts longer than it are prefilled in chunks. Default: the profile's
	// MaxNumBatchedTokens, else 8192.
	MaxBatchTokens int
	// MaxModelLen caps prompt+output tokens per request. Default: the GPU capacity in tokens.
	MaxModelLen int
	// Profile is the timing model. Default: the named profile DefaultProfile.
	Profile Profile
	// HashSeed seeds the engine's opaque block hashes (vLLM's NONE_HASH).
	// Two engines with the same seed produce the same hashes for the same tokens.
	HashSeed uint64
	// Medium is the medium string of GPU events. Default "GPU".
	Medium string
	// KeepBlockTokens keeps every cached block's tokens and parent so
	// CachedBlocks can return them (tests comparing a router's index with the
	// engine's own cache). Costs 4·BlockSize bytes per block; off in benchmarks.
	KeepBlockTokens bool
	// Keyer, when set, computes a router-side key for every cached block (the
	// kvmesh key) so CachedBlocks can report it; nil costs nothing.
	Keyer BlockKeyer
	// RecordTokenTimes keeps every output token's time in Result.TokenTimes
	// (inter-token latency histograms). Off, only the first and last are kept.
	RecordTokenTimes bool
	// MaxFusedSteps bounds how many decode-only steps one Step call may fuse
	// (see Step). Default 64; 1 disables fusing.
	MaxFusedSteps int
}

// BlockKeyer computes a chain of router keys over a request's blocks, e.g.
// kvevents.Root and kvevents.ChainKey. Called from Step; must be pure.
type BlockKeyer interface {
	Root(lora, salt string) uint64
	Chain(parent uint64, block []uint32) uint64
}

// Defaults returns c with every zero field set to its default.
func (c Config) Defaults() Config {
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.GPUBlocks == 0 {
		c.GPUBlocks = 4096
	}
	if c.Profile.Name == "" && c.Profile.Params == 0 {
		c.Profile = profiles[DefaultProfile]
	}
	if c.MaxRunning == 0 {
		c.MaxRunning = cmp.Or(c.Profile.MaxNumSeqs, 256)
	}
	if c.MaxBatchTokens == 0 {
		c.MaxBatchTokens = cmp.Or(c.Profile.MaxNumBatchedTokens, 8192)
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = c.GPUBlocks * c.BlockSize
	}
	if c.Medium == "" {
		c.Medium = "GPU"
	}
	if c.MaxFusedSteps == 0 {
		c.MaxFusedSteps = 64
	}
	return c
}

// Validate lists every problem with c (after Defaults).
func (c Config) Validate() error {
	var errs []error
	if c.BlockSize <= 0 || c.BlockSize > 1024 {
		errs = append(errs, fmt.Errorf("block size %d: want 1..1024", c.BlockSize))
	}
	if c.GPUBlocks <= 0 || c.GPUBlocks > 1<<30 {
		errs = append(errs, fmt.Errorf("gpu blocks %d: want 1..2^30", c.GPUBlocks))
	}
	if c.CPUBlocks < 0 || c.CPUBlocks > 1<<30 {
		errs = append(errs, fmt.Errorf("cpu blocks %d: want 0..2^30", c.CPUBlocks))
	}
	if c.MaxRunning <= 0 {
		errs = append(errs, fmt.Errorf("max running %d: want > 0", c.MaxRunning))
	}
	if c.MaxBatchTokens <= 0 {
		errs = append(errs, fmt.Errorf("max batch tokens %d: want > 0", c.MaxBatchTokens))
	}
	if c.MaxModelLen <= 0 {
		errs = append(errs, fmt.Errorf("max model len %d: want > 0", c.MaxModelLen))
	}
	if c.MaxFusedSteps <= 0 {
		errs = append(errs, fmt.Errorf("max fused steps %d: want > 0", c.MaxFusedSteps))
	}
	errs = append(errs, c.Profile.validate()...)
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInvalidConfig, errors.Join(errs...))
	}
	return nil
}
