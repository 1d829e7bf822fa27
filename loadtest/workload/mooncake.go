package workload

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"time"
)

// MooncakeBlockTokens is the tokens per hash_id block of Mooncake's own
// traces, and Mooncake.BlockTokens' default.
const MooncakeBlockTokens = 512

// Mooncake configures reading a Mooncake-format trace: JSON lines of
// {"timestamp": ms, "input_length": n, "output_length": n, "hash_ids": [...]}
// where hash_ids identify prefix blocks of BlockTokens tokens (equal ids ⇒
// equal tokens), as Mooncake's traces and aiperf's and Dynamo's tools write
// them:
//   - hash_ids may cover the prompt rounded up (Mooncake: the last block
//     may be partial) or down (n // block ids, as Dynamo's data generator
//     documents the format); tokens past the last block are the request's
//     own. Without hash_ids (or with an empty list) the whole prompt is.
//   - timestamps may be absolute (epoch milliseconds) and rows in any
//     order: arrivals are the timestamps less the earliest, rows sorted by
//     them (ties keep file order).
//   - aiperf's multi-turn rows: a row with a session_id and a delay but no
//     timestamp is its session's next turn, sent delay ms after the
//     session's previous row has been answered (Request.After and Think;
//     its Arrival is the estimate delay after the previous row's).
//   - output_length may be missing (aiperf then lets the engine stop at end
//     of sequence): Output tokens are generated.
//
// Unknown fields are ignored. A session_id, when present, is the request's
// session (for session affinity); otherwise the first hash id is.
//
// With Bailian set it reads Alibaba's Bailian traces
// (qwen-bailian-usagetraces-anon, aiperf's bailian_trace) instead: the same
// fields with timestamps in seconds, hash_ids of 16-token blocks, and
// sessions linked by chat_id and parent_chat_id (-1 for a session's first
// turn); every turn has its own timestamp, so the replay is the trace's.
type Mooncake struct {
	// RateScale multiplies the arrival rate (timestamps are divided by it).
	// The zero value means the default, 1 (so Mooncake{} reads a trace as
	// recorded); a negative, NaN or infinite scale is an error. A command
	// line that wants to reject an explicit 0 must do so itself.
	RateScale float64
	// Seed fixes the token ids of each hash id.
	Seed uint64
	// Limit keeps only the first Limit requests by arrival (0 = all;
	// negative is an error).
	Limit int
	// MaxLineBytes bounds one line. Default 16 MiB.
	MaxLineBytes int
	// BlockTokens is the tokens per hash_ids block (aiperf's and Dynamo's
	// --block-size). Default MooncakeBlockTokens (512); at most 1<<20.
	BlockTokens int
	// Output is the output length of rows without output_length. 0: such
	// a row is an error.
	Output int
	// Bailian reads Bailian's form (see Mooncake); BlockTokens then
	// defaults to 16.
	Bailian bool
}

// BailianBlockTokens is the tokens per hash_ids block of Bailian's traces.
const BailianBlockTokens = 16

type mooncakeLine struct {
	Timestamp    *float64        `json:"timestamp"`
	Delay        *float64        `json:"delay"`
	SessionID    json.RawMessage `json:"session_id"`
	InputLength  *int            `json:"input_length"`
	OutputLength *int            `json:"output_length"`
	HashIDs      []hashID        `json:"hash_ids"`
	TextInput    json.RawMessage `json:"text_input"`
	ChatID       json.RawMessage `json:"chat_id"`        // Bailian
	ParentChatID json.RawMessage `json:"parent_chat_id"` // Bailian
}

// hashID is a hash_ids entry: an unsigned or a signed 64-bit integer (a
// hash printed signed keeps its bits).
type hashID uint64

func (h *hashID) UnmarshalJSON(b []byte) error {
	if u, err := strconv.ParseUint(string(b), 10, 64); err == nil {
		*h = hashID(u)
		return nil
	}
	i, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return fmt.Errorf("hash id %.40s: want a 64-bit integer", b)
	}
	*h = hashID(uint64(i))
	return nil
}

// maxTraceMillis bounds a timestamp or a delay (about 31,700 years):
// arrivals stay exact in a float64 and a time.Duration.
const maxTraceMillis = 1e15

// ReadFile reads a trace file.
func (c Mooncake) ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	defer f.Close()
	return c.Read(f)
}

// mooncakeRow is one parsed line, before arrivals are known.
type mooncakeRow struct {
	at      float64 // ms, as recorded (absolute or relative); a follow-up's estimate
	line    int
	in, out int
	ids     []hashID
	session string
	prev    int     // a follow-up's predecessor (index in rows), else -1
	think   float64 // a follow-up's delay, ms
}

// lastTurn is a session's latest row: its time and index in rows.
type lastTurn struct {
	at  float64
	row int
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
	if c.BlockTokens == 0 {
		c.BlockTokens = MooncakeBlockTokens
		if c.Bailian {
			c.BlockTokens = BailianBlockTokens
		}
	}
	if c.BlockTokens < 1 || c.BlockTokens > 1<<20 || c.Output < 0 || c.Output > MaxTraceTokens {
		return nil, fmt.Errorf("%w: trace block size %d (want 1..%d), output %d (want 0..%d)", ErrBadWorkload, c.BlockTokens, 1<<20, c.Output, MaxTraceTokens)
	}
	if c.MaxLineBytes == 0 {
		c.MaxLineBytes = 16 << 20
	}
	r, err := traceText(r)
	if err != nil {
		return nil, err
	}
	sc := bufio.NewScanner(r)
	// The scanner's limit is the larger of its buffer's capacity and
	// MaxLineBytes: a smaller buffer makes a limit under 64 KiB hold.
	buf := 64 << 10
	if c.MaxLineBytes > 0 {
		buf = min(buf, c.MaxLineBytes)
	}
	sc.Buffer(make([]byte, 0, buf), c.MaxLineBytes)
	var rows []mooncakeRow
	prev := make(map[string]lastTurn) // session → its latest row
	roots := make(map[string]string)  // Bailian: chat_id → its session's first chat_id
	line := 0
	for sc.Scan() {
		line++
		if len(bytes.TrimSpace(sc.Bytes())) == 0 {
			continue
		}
		row, err := c.parse(sc.Bytes(), line, len(rows), prev, roots)
		if err != nil {
			if rerr := sc.Err(); rerr != nil {
				// A read error (a truncated gzip file) cut the line
				// short: the error is the read's.
				return nil, fmt.Errorf("%w: trace line %d: %w", ErrBadWorkload, line, rerr)
			}
			return nil, err
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); errors.Is(err, bufio.ErrTooLong) {
		return nil, fmt.Errorf("%w: trace line %d: longer than the reader's limit of %d bytes a line (Mooncake.MaxLineBytes): %w", ErrBadWorkload, line+1, max(buf, c.MaxLineBytes), err)
	} else if err != nil {
		return nil, fmt.Errorf("%w: trace line %d: %w", ErrBadWorkload, line+1, err)
	}
	return c.requests(rows)
}

// parse reads line, the trace's row idx; prev holds each session's latest
// row (a delay row's predecessor) and roots each Bailian chat's session,
// both updated here.
func (c Mooncake) parse(b []byte, line, idx int, prev map[string]lastTurn, roots map[string]string) (mooncakeRow, error) {
	bad := func(format string, a ...any) (mooncakeRow, error) {
		return mooncakeRow{}, fmt.Errorf("%w: trace line %d: %s", ErrBadWorkload, line, fmt.Sprintf(format, a...))
	}
	var m mooncakeLine
	if err := json.Unmarshal(b, &m); err != nil {
		return mooncakeRow{}, fmt.Errorf("%w: trace line %d: %w", ErrBadWorkload, line, err)
	}
	if m.InputLength == nil {
		if len(m.TextInput) > 0 {
			return bad("text_input without input_length: replaying a trace needs token counts")
		}
		return bad("missing input_length")
	}
	session, err := sessionID(m.SessionID)
	if err != nil {
		return bad("session_id %s: %v", m.SessionID, err)
	}
	if c.Bailian {
		if session, err = bailianSession(m.ChatID, m.ParentChatID, roots); err != nil {
			return bad("%v", err)
		}
		if m.Timestamp != nil { // seconds
			if sec := *m.Timestamp; !(sec >= 0 && sec <= maxTraceMillis/1000) { // NaN too
				return bad("timestamp %v: want 0..%g seconds", sec, maxTraceMillis/1000)
			}
			ms := *m.Timestamp * 1000
			m.Timestamp, m.Delay = &ms, nil
		}
	}
	row := mooncakeRow{line: line, in: *m.InputLength, ids: m.HashIDs, session: session, out: c.Output, prev: -1}
	if m.OutputLength != nil {
		row.out = *m.OutputLength
	} else if c.Output == 0 {
		return bad("missing output_length (and no default output length given)")
	}
	okMillis := func(v float64) bool { return v >= 0 && v <= maxTraceMillis } // false for NaN
	switch last, follows := prev[session]; {
	case m.Timestamp != nil:
		if !okMillis(*m.Timestamp) {
			return bad("timestamp %v: want 0..%g milliseconds", *m.Timestamp, float64(maxTraceMillis))
		}
		row.at = *m.Timestamp
	case m.Delay != nil && session != "" && follows:
		if !okMillis(*m.Delay) {
			return bad("delay %v: want 0..%g milliseconds", *m.Delay, float64(maxTraceMillis))
		}
		row.at, row.prev, row.think = last.at+*m.Delay, last.row, *m.Delay
	default:
		return bad("missing timestamp (a row without one needs a session_id and a delay after an earlier row of its session)")
	}
	if session != "" {
		prev[session] = lastTurn{at: row.at, row: idx}
	}
	if row.in <= 0 {
		return bad("input_length %d: must be > 0", row.in)
	}
	if row.out < 0 {
		return bad("output_length %d: must be ≥ 0", row.out)
	}
	if row.in > MaxTraceTokens || row.out > MaxTraceTokens {
		return bad("input_length %d, output_length %d: a row may hold at most %d tokens each (workload.MaxTraceTokens)", row.in, row.out, MaxTraceTokens)
	}
	if n, bt := len(row.ids), c.BlockTokens; n > 0 && (row.in <= (n-1)*bt || row.in >= (n+1)*bt) {
		return bad("input_length %d does not fit %d blocks of %d tokens%s", row.in, n, bt, blockHint(row.in, n))
	}
	return row, nil
}

// sessionID is a session_id's text: a JSON string or number (aiperf
// writes strings; some converters numbers); "" when absent.
func sessionID(raw json.RawMessage) (string, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var n json.Number
	if err := json.Unmarshal(raw, &n); err != nil {
		return "", fmt.Errorf("want a string or a number")
	}
	return n.String(), nil
}

// bailianSession is a Bailian row's session: the chat_id of its first
// turn, found through parent_chat_id (-1 or absent: the row starts one; a
// parent not in the file starts one at the parent).
func bailianSession(chat, parent json.RawMessage, roots map[string]string) (string, error) {
	id, err := sessionID(chat)
	if err != nil || id == "" {
		return "", fmt.Errorf("chat_id %s: want a string or a number", chat)
	}
	p, err := sessionID(parent)
	if err != nil {
		return "", fmt.Errorf("parent_chat_id %s: %w", parent, err)
	}
	root := id
	if p != "" && p != "-1" {
		if root = roots[p]; root == "" {
			root = p
		}
	}
	roots[id] = root
	return "b" + root, nil
}

// blockHint names the smallest power-of-two block size that n blocks of a
// prompt of in tokens would fit, for the error of a trace read with the
// wrong one.
func blockHint(in, n int) string {
	for bt := 1; bt <= 1<<20; bt *= 2 {
		if in > (n-1)*bt && in < (n+1)*bt {
			return fmt.Sprintf(" (its blocks look like %d tokens: --trace-block-size %d?)", bt, bt)
		}
	}
	return ""
}

// requests turns the rows into requests: arrivals from the earliest row,
// scaled, sorted (stable), the first Limit kept.
func (c Mooncake) requests(rows []mooncakeRow) ([]Request, error) {
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: the trace has no requests", ErrBadWorkload)
	}
	t0 := rows[0].at
	for _, r := range rows {
		t0 = min(t0, r.at)
	}
	arrivals := make([]time.Duration, len(rows))
	for i, r := range rows {
		// A tiny rate scale can push a valid timestamp past what a
		// time.Duration holds (the float-to-int conversion would then be
		// implementation-defined).
		ns := (r.at - t0) / c.RateScale * float64(time.Millisecond)
		if ns >= math.MaxInt64 {
			return nil, fmt.Errorf("%w: trace line %d: %v ms after the first request at rate scale %v overflows", ErrBadWorkload, r.line, r.at-t0, c.RateScale)
		}
		arrivals[i] = time.Duration(ns)
	}
	order := make([]int, len(rows))
	for i := range order {
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int { return cmp.Compare(arrivals[a], arrivals[b]) })
	if c.Limit > 0 && len(order) > c.Limit {
		order = order[:c.Limit]
	}
	// A follow-up comes after its predecessor (its estimate is no earlier,
	// and the stable sort keeps file order on ties), so a Limit that keeps
	// it keeps the predecessor.
	pos := make([]int, len(rows))
	for i := range pos {
		pos[i] = -1
	}
	for k, i := range order {
		pos[i] = k
	}
	reqs := make([]Request, 0, len(order))
	for _, i := range order {
		r := &rows[i]
		session := r.session
		switch {
		case session != "":
		case len(r.ids) > 0:
			session = "h" + strconv.FormatUint(uint64(r.ids[0]), 10)
		default:
			session = "l" + strconv.Itoa(r.line)
		}
		reqs = append(reqs, Request{
			ID:           len(reqs),
			Arrival:      arrivals[i],
			PromptTokens: r.in,
			OutputTokens: max(r.out, 1),
			ZeroOutput:   r.out == 0,
			Group:        -1,
			Session:      session,
			src:          &mooncakeSource{seed: c.Seed, ids: r.ids, block: c.BlockTokens, own: uint64(r.line)},
		})
		if r.prev >= 0 && pos[r.prev] >= 0 {
			reqs[len(reqs)-1].After = pos[r.prev] + 1
			reqs[len(reqs)-1].Think = time.Duration(r.think / c.RateScale * float64(time.Millisecond))
		}
	}
	return reqs, nil
}

type mooncakeSource struct {
	seed  uint64
	ids   []hashID
	block int
	own   uint64 // the row's line: its own tokens past the blocks
}

// ownSalt separates a row's own tokens from every hash id's.
const ownSalt = 0x6A09E667F3BCC909

func (s *mooncakeSource) appendPrompt(dst []uint32, r *Request) []uint32 {
	left := r.PromptTokens
	for _, id := range s.ids {
		n := min(left, s.block)
		for i := 0; i < n; i++ {
			dst = append(dst, token(s.seed, uint64(id), i))
		}
		left -= n
	}
	for i := 0; i < left; i++ {
		dst = append(dst, token(s.seed^ownSalt, s.own, i))
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
