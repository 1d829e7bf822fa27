package workload

import (
	"cmp"
	"encoding/csv"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Azure reads an Azure LLM inference trace (AzurePublicDataset, 2023 and
// 2024: CSV with a header of TIMESTAMP, ContextTokens, GeneratedTokens;
// timestamps like "2023-11-16 18:15:46.6805900" (2023) or
// "2024-05-10 00:00:00.009930+00:00" (2024), or RFC 3339), or any CSV trace
// of arrival times and lengths whose header names them — BurstGPT's
// Timestamp, Request tokens, Response tokens (in any order, other columns
// ignored; csvColumns lists the names), with timestamps as dates or as
// numbers of seconds (milliseconds from 10^11 on: epoch ms) — and gives its prompts
// synthetic prefixes, since the trace records lengths only: a share Share
// of the requests starts with one of Groups shared prefixes (Zipf
// popularity with exponent ZipfS; prefix g is PrefixMin..PrefixMax
// tokens, drawn once per prefix, cut to the request's length), and the
// rest of every prompt is its own. Arrival times (from the earliest row;
// rows in any order) and lengths are the trace's.
type Azure struct {
	// RateScale divides arrival times (0: 1; negative, NaN, Inf: error).
	RateScale float64
	// Limit keeps the Limit earliest requests (0: all; negative: error).
	Limit int
	// Groups shared prefixes (default 32), PrefixMin..PrefixMax tokens
	// long (defaults 256 and 2,048), Share of requests carrying one
	// (default 0.8; set Share < 0 for none), ZipfS their popularity
	// (> 1, default 1.1).
	Groups               int
	PrefixMin, PrefixMax int
	Share                float64
	ZipfS                float64
	// Seed fixes the prefixes and the token ids.
	Seed uint64
}

// azureLayouts are the timestamp forms: the 2023 traces' (no zone: UTC),
// the 2024 traces' (with a zone), RFC 3339.
var azureLayouts = []string{"2006-01-02 15:04:05.999999999", "2006-01-02 15:04:05.999999999Z07:00", time.RFC3339Nano}

func parseAzureTime(s string) (t time.Time, err error) {
	for _, l := range azureLayouts {
		if t, err = time.Parse(l, s); err == nil {
			return t, nil
		}
	}
	return t, fmt.Errorf("%q is none of %q", s, azureLayouts)
}

// Column names csvColumns accepts, compared lower-cased without spaces,
// underscores or dashes.
var (
	csvTimeNames   = []string{"timestamp", "time", "arrivaltime", "arrival"}
	csvInputNames  = []string{"contexttokens", "requesttokens", "inputtokens", "inputlength", "prompttokens", "promptlength"}
	csvOutputNames = []string{"generatedtokens", "responsetokens", "outputtokens", "outputlength", "completiontokens"}
)

// csvColumns reads a header row: the indexes of the timestamp, prompt and
// output columns. ok is false when rec is a data row (its first field is a
// timestamp): the columns are then the first three.
func csvColumns(rec []string) (cols [3]int, ok bool, err error) {
	if _, err := parseTraceTime(strings.TrimSpace(rec[0])); err == nil {
		return [3]int{0, 1, 2}, false, nil
	}
	cols = [3]int{-1, -1, -1}
	for i, name := range rec {
		n := strings.NewReplacer(" ", "", "_", "", "-", "").Replace(strings.ToLower(strings.TrimSpace(name)))
		for k, names := range [3][]string{csvTimeNames, csvInputNames, csvOutputNames} {
			if cols[k] < 0 && slices.Contains(names, n) {
				cols[k] = i
			}
		}
	}
	if cols[0] < 0 || cols[1] < 0 || cols[2] < 0 {
		return cols, true, fmt.Errorf("header %q names no timestamp, prompt-length and output-length columns (e.g. TIMESTAMP, ContextTokens, GeneratedTokens, or BurstGPT's Timestamp, Request tokens, Response tokens)", strings.Join(rec, ","))
	}
	return cols, true, nil
}

// parseTraceTime reads a timestamp: a date (parseAzureTime) or a number of
// seconds (milliseconds from 10^11 on).
func parseTraceTime(s string) (time.Time, error) {
	t, err := parseAzureTime(s)
	if err == nil {
		return t, nil
	}
	f, ferr := strconv.ParseFloat(s, 64)
	if ferr != nil || math.IsNaN(f) || math.IsInf(f, 0) || f < 0 || f > 1e15 {
		return t, fmt.Errorf("%q is neither a date (%q) nor a number of seconds", s, azureLayouts)
	}
	if f >= 1e11 {
		f /= 1000 // epoch milliseconds
	}
	sec, frac := math.Modf(f)
	return time.Unix(int64(sec), int64(frac*1e9)), nil
}

// ReadFile reads a trace file.
func (c Azure) ReadFile(path string) ([]Request, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	defer f.Close()
	return c.Read(f)
}

func (c *Azure) defaults() error {
	def(&c.Groups, 32)
	def(&c.PrefixMin, 256)
	def(&c.PrefixMax, 2048)
	deff(&c.Share, 0.8)
	deff(&c.ZipfS, 1.1)
	if c.Groups < 0 || c.PrefixMin < 1 || c.PrefixMax < c.PrefixMin || c.Share > 1 || !(c.ZipfS > 1) || math.IsNaN(c.Share) {
		return fmt.Errorf("%w: azure groups %d, prefix %d..%d, share %v, zipf %v", ErrBadWorkload, c.Groups, c.PrefixMin, c.PrefixMax, c.Share, c.ZipfS)
	}
	return nil
}

// azureRow is one row read: its timestamp, lengths, line, and arrival
// (from the earliest row).
type azureRow struct {
	ts      time.Time
	at      time.Duration
	in, out int
	line    int
}

// Read parses a trace. Every malformed row is an error naming the line.
// Rows may come in any order: requests are sorted by arrival.
func (c Azure) Read(r io.Reader) ([]Request, error) {
	if err := c.defaults(); err != nil {
		return nil, err
	}
	if c.Limit < 0 {
		return nil, fmt.Errorf("%w: limit %d is negative", ErrBadWorkload, c.Limit)
	}
	rng := rand.New(rand.NewPCG(c.Seed, 0xa2)) // #nosec G404 -- a benchmark's seeded stream
	plen := make([]int, c.Groups)
	for i := range plen {
		plen[i] = c.PrefixMin + rng.IntN(c.PrefixMax-c.PrefixMin+1)
	}
	zipf := rand.NewZipf(rng, c.ZipfS, 1, uint64(max(c.Groups-1, 0)))
	r, err := traceText(r)
	if err != nil {
		return nil, err
	}
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1 // checked against the columns below
	cr.ReuseRecord = true
	cols, width := [3]int{0, 1, 2}, 3 // width: the fields a row has (the header's)
	var rows []azureRow
	for line := 1; ; line++ {
		rec, err := cr.Read()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%w: azure trace line %d: %w", ErrBadWorkload, line, err)
		}
		if line == 1 {
			var header bool
			if cols, header, err = csvColumns(rec); err != nil {
				return nil, fmt.Errorf("%w: azure trace line 1: %w", ErrBadWorkload, err)
			}
			if header {
				width = len(rec)
				continue
			}
		}
		if len(rec) != width {
			return nil, fmt.Errorf("%w: azure trace line %d: %d fields, want %d (as the header or, without one, timestamp, prompt and output tokens)", ErrBadWorkload, line, len(rec), width)
		}
		ts, err := parseTraceTime(strings.TrimSpace(rec[cols[0]]))
		if err != nil {
			return nil, fmt.Errorf("%w: azure trace line %d: timestamp: %w", ErrBadWorkload, line, err)
		}
		in, err := strconv.Atoi(strings.TrimSpace(rec[cols[1]]))
		if err != nil || in <= 0 {
			return nil, fmt.Errorf("%w: azure trace line %d: prompt tokens %q: must be an integer > 0", ErrBadWorkload, line, rec[cols[1]])
		}
		out, err := strconv.Atoi(strings.TrimSpace(rec[cols[2]]))
		if err != nil || out < 0 {
			return nil, fmt.Errorf("%w: azure trace line %d: output tokens %q: must be an integer ≥ 0", ErrBadWorkload, line, rec[cols[2]])
		}
		if in > MaxTraceTokens || out > MaxTraceTokens {
			return nil, fmt.Errorf("%w: azure trace line %d: prompt tokens %d, output tokens %d: a row may hold at most %d tokens each (workload.MaxTraceTokens)", ErrBadWorkload, line, in, out, MaxTraceTokens)
		}
		rows = append(rows, azureRow{ts: ts, in: in, out: out, line: line})
	}
	if len(rows) == 0 {
		return nil, fmt.Errorf("%w: the azure trace has no requests", ErrBadWorkload)
	}
	// Rows in any order, as the Mooncake reader takes them: arrivals count
	// from the earliest, the rows sorted by them (stably; finish then
	// orders ties by session, as for every generated workload), and Limit
	// keeps the earliest.
	t0 := rows[0].ts
	for _, r := range rows {
		if r.ts.Before(t0) {
			t0 = r.ts
		}
	}
	for i := range rows {
		if rows[i].at = rows[i].ts.Sub(t0); rows[i].at == math.MaxInt64 {
			return nil, fmt.Errorf("%w: azure trace line %d: timestamps span more than time.Duration holds", ErrBadWorkload, rows[i].line)
		}
	}
	slices.SortStableFunc(rows, func(a, b azureRow) int { return cmp.Compare(a.at, b.at) })
	if c.Limit > 0 && len(rows) > c.Limit {
		rows = rows[:c.Limit]
	}
	reqs := make([]Request, 0, len(rows))
	for _, row := range rows {
		id := uint64(len(reqs))
		segs := make([]segment, 0, 2)
		g := -1
		if c.Groups > 0 && rng.Float64() < c.Share {
			g = int(zipf.Uint64())
			segs = append(segs, seg(streamSystem, uint64(g), min(plen[g], row.in)))
		}
		if rest := row.in - segTokens(segs); rest > 0 {
			segs = append(segs, seg(streamUnique, id, rest))
		}
		reqs = append(reqs, Request{Arrival: row.at, PromptTokens: row.in, OutputTokens: max(row.out, 1), ZeroOutput: row.out == 0, Group: g,
			Session: "a" + strconv.FormatUint(id, 10), src: &segSource{seed: c.Seed, segs: segs}})
	}
	return finish(reqs, c.RateScale, 0)
}
