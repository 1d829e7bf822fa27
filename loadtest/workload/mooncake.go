package workload

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"time"
)

// MooncakeBlockTokens is the tokens per hash_id block of Mooncake traces.
const MooncakeBlockTokens = 512

// Mooncake configures reading a Mooncake-format trace: JSON lines of
// {"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}
// where hash_ids identify 512-token prefix blocks (equal ids ⇒ equal
// tokens); the last block may be partial.
type Mooncake struct {
	// RateScale multiplies the arrival rate (timestamps are divided by it).
	// The zero value means the default, 1 (so Mooncake{} reads a trace as
	// recorded); a negative, NaN or infinite scale is an error. A command
	// line that wants to reject an explicit 0 must do so itself.
	RateScale float64
	// Seed fixes the token ids of each hash id.
	Seed uint64
	// Limit keeps only the first Limit requests (0 = all; negative is an
	// error).
	Limit int
	// MaxLineBytes bounds one line. Default 16 MiB.
	MaxLineBytes int
}

type mooncakeLine struct {
	Timestamp    *float64  `json:"timestamp"`
	InputLength  *int      `json:"input_length"`
	OutputLength *int      `json:"output_length"`
	HashIDs      *[]uint64 `json:"hash_ids"`
}

// ReadFile reads a trace file.
func (c Mooncake) ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	defer f.Close()
	return c.Read(f)
}

// Read parses a trace. Every malformed line is an error naming the line:
// a benchmark on a silently truncated trace would mislead.
func (c Mooncake) Read(r io.Reader) ([]Request, error) {
	if c.RateScale == 0 {
		c.RateScale = 1
	}
	if c.RateScale < 0 || math.IsNaN(c.RateScale) || math.IsInf(c.RateScale, 0) {
		return nil, fmt.Errorf("%w: rate scale %v", ErrBadWorkload, c.RateScale)
	}
	if c.Limit < 0 {
		return nil, fmt.Errorf("%w: limit %d is negative", ErrBadWorkload, c.Limit)
	}
	if c.MaxLineBytes == 0 {
		c.MaxLineBytes = 16 << 20
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), c.MaxLineBytes)
	var reqs []Request
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(trimSpace(b)) == 0 {
			continue
		}
		var m mooncakeLine
		if err := json.Unmarshal(b, &m); err != nil {
			return nil, fmt.Errorf("%w: trace line %d: %w", ErrBadWorkload, line, err)
		}
		if m.Timestamp == nil || m.InputLength == nil || m.OutputLength == nil || m.HashIDs == nil {
			return nil, fmt.Errorf("%w: trace line %d: missing timestamp, input_length, output_length or hash_ids", ErrBadWorkload, line)
		}
		in, out, ids := *m.InputLength, *m.OutputLength, *m.HashIDs
		ts := *m.Timestamp
		switch {
		case ts < 0 || math.IsNaN(ts) || math.IsInf(ts, 0) || ts > 1e15:
			return nil, fmt.Errorf("%w: trace line %d: timestamp %v", ErrBadWorkload, line, ts)
		case in <= 0 || out < 0:
			return nil, fmt.Errorf("%w: trace line %d: input_length %d, output_length %d", ErrBadWorkload, line, in, out)
		case len(ids) == 0 || in > len(ids)*MooncakeBlockTokens || in <= (len(ids)-1)*MooncakeBlockTokens:
			return nil, fmt.Errorf("%w: trace line %d: input_length %d does not fit %d blocks of %d", ErrBadWorkload, line, in, len(ids), MooncakeBlockTokens)
		}
		// A tiny rate scale can push a valid timestamp past what a
		// time.Duration holds (the float-to-int conversion would then be
		// implementation-defined).
		ns := ts / c.RateScale * float64(time.Millisecond)
		if ns >= math.MaxInt64 {
			return nil, fmt.Errorf("%w: trace line %d: timestamp %v ms at rate scale %v overflows", ErrBadWorkload, line, ts, c.RateScale)
		}
		arrival := time.Duration(ns)
		if len(reqs) > 0 && arrival < reqs[len(reqs)-1].Arrival {
			return nil, fmt.Errorf("%w: trace line %d: timestamps go backwards", ErrBadWorkload, line)
		}
		reqs = append(reqs, Request{
			ID:           len(reqs),
			Arrival:      arrival,
			PromptTokens: in,
			OutputTokens: max(out, 1),
			Group:        -1,
			Session:      "h" + strconv.FormatUint(ids[0], 10),
			src:          &mooncakeSource{seed: c.Seed, ids: ids},
		})
		if c.Limit > 0 && len(reqs) == c.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%w: trace line %d: %w", ErrBadWorkload, line+1, err)
	}
	return reqs, nil
}

func trimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\r') {
		b = b[1:]
	}
	return b
}

type mooncakeSource struct {
	seed uint64
	ids  []uint64
}

func (s *mooncakeSource) appendPrompt(dst []uint32, r *Request) []uint32 {
	left := r.PromptTokens
	for _, id := range s.ids {
		n := min(left, MooncakeBlockTokens)
		for i := 0; i < n; i++ {
			dst = append(dst, token(s.seed, id, i))
		}
		left -= n
	}
	return dst
}

// OracleHitRate is the prefix hit rate of an infinite cache shared by
// every engine, in tokens: a block is a hit when the same prefix (the same
// chain of block ids up to it) appeared earlier. Only full blocks of
// blockSize tokens can hit, as in vLLM.
func OracleHitRate(reqs []Request, blockSize int) float64 {
	var hit, total int
	for i, h := range OracleHits(reqs, blockSize) {
		hit += h
		total += reqs[i].PromptTokens
	}
	if total == 0 {
		return 0
	}
	return float64(hit) / float64(total)
}

// OracleHits is, per request in arrival order, how many leading prompt
// tokens an infinite cache shared by every engine holds when it arrives
// (whole blocks whose prefix appeared in an earlier request): no router
// can give a request more cached tokens than this.
func OracleHits(reqs []Request, blockSize int) []int {
	hits := make([]int, len(reqs))
	if blockSize <= 0 {
		return hits
	}
	seen := make(map[uint64]struct{})
	var buf []uint32
	for i := range reqs {
		buf = reqs[i].AppendPrompt(buf[:0])
		h := uint64(0x9E3779B97F4A7C15)
		miss := false
		for b := 0; (b+1)*blockSize <= len(buf); b++ {
			for _, t := range buf[b*blockSize : (b+1)*blockSize] {
				h = (h ^ uint64(t)) * 0x100000001B3
			}
			if !miss {
				if _, ok := seen[h]; ok {
					hits[i] += blockSize
					continue
				}
			}
			miss = true
			seen[h] = struct{}{}
		}
	}
	return hits
}
