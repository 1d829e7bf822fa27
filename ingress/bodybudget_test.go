package ingress

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// paddedBody is a completions request for model of exactly size bytes.
func paddedBody(t *testing.T, model string, stream bool, size int) string {
	t.Helper()
	head := `{"model":"` + model + `","stream":` + map[bool]string{true: "true", false: "false"}[stream] + `,"prompt":"`
	const tail = `"}`
	pad := size - len(head) - len(tail)
	if pad < 0 {
		t.Fatalf("size %d too small", size)
	}
	return head + strings.Repeat("x", pad) + tail
}

// openStream starts a streamed request and reads its first event: the
// request is then in service, its body charged. The caller closes the
// body (a client that leaves mid-stream).
func openStream(t *testing.T, url, body string) *http.Response {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	if resp.StatusCode != 200 {
		t.Fatalf("stream: status %d", resp.StatusCode)
	}
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first line %q: %v", line, err)
	}
	return resp
}

// gathered is the value of the one series named name in reg, or -1.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			m := mf.GetMetric()[0]
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// wantBudgetRefusal checks a 503 for the body budget, as documented.
func wantBudgetRefusal(t *testing.T, st int, hdr http.Header, b []byte) {
	t.Helper()
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(b, &e); err != nil || st != 503 || hdr.Get("Retry-After") != "1" ||
		e.Error.Code != "ingress_body_budget_exhausted" || e.Error.Type != "server_error" ||
		!strings.Contains(e.Error.Message, "--max-body-in-flight") || !strings.Contains(e.Error.Message, "its own memory bound") {
		t.Fatalf("want 503 ingress_body_budget_exhausted with Retry-After 1, got %d %v %s", st, hdr, b)
	}
}

// TestBodyBudgetRefusesLargeBodies: with --max-body-in-flight's bytes held
// by streams in service, a body over 64 KiB that would pass it is refused
// at once with 503; a small one is served; the bytes come back when the
// requests end, a client that leaves mid-stream and an error answer
// included, and a large body then fits.
func TestBodyBudgetRefusesLargeBodies(t *testing.T) {
	slow := startFaultEngine(t, faultSlowStream)
	ok := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "slow", Model: "slow", URL: slow.url()}, StaticEngine{ID: "ok", Model: "m", URL: ok.url()})
	cfg.MaxBodyBytes, cfg.MaxBodyBytesInFlight = 1<<20, 1<<20
	cfg.MaxPromptTokens = 0 // the padding is no prompt limit's business
	reg := prometheus.NewRegistry()
	s := startIngress(t, cfg, Deps{Registry: reg})
	url := "http://" + s.Addr() + "/v1/completions"
	if g, r := gathered(t, reg, "kvmesh_ingress_body_bytes_in_flight"), gathered(t, reg, "kvmesh_ingress_body_budget_refusals_total"); g != 0 || r != 0 {
		t.Fatalf("series at start: bytes in flight %v, refusals %v; want both at 0", g, r)
	}

	const kib = 1 << 10
	a := openStream(t, url, paddedBody(t, "slow", true, 700*kib))
	b := openStream(t, url, paddedBody(t, "slow", true, 300*kib))
	if got := val(s.m.bodyBytes); got != 1000*kib {
		t.Fatalf("bytes in flight %v, want %d", got, 1000*kib)
	}

	st, hdr, body := post(t, http.DefaultClient, url, paddedBody(t, "m", false, 100*kib))
	wantBudgetRefusal(t, st, hdr, body)
	if got := gathered(t, reg, "kvmesh_ingress_body_budget_refusals_total"); got != 1 {
		t.Fatalf("refusals %v, want 1", got)
	}
	// 64 KiB or less always passes, though it takes the sum past the bound.
	if st, _, body := post(t, http.DefaultClient, url, paddedBody(t, "m", false, 64*kib)); st != 200 {
		t.Fatalf("small body while the budget is full: %d %s", st, body)
	}

	a.Body.Close() // the client leaves mid-stream
	testutil.WaitFor(t, 5*time.Second, "the stream's body bytes given back", func() bool { return val(s.m.bodyBytes) == 300*kib })
	if st, _, body := post(t, http.DefaultClient, url, paddedBody(t, "m", false, 100*kib)); st != 200 {
		t.Fatalf("a body that fits again: %d %s", st, body)
	}
	if st, _, body := post(t, http.DefaultClient, url, paddedBody(t, "nope", false, 100*kib)); st != 404 {
		t.Fatalf("unknown model: %d %s", st, body)
	}
	b.Body.Close()
	waitSettled(t, s)
	if g, n := val(s.m.bodyBytes), s.bodyBytes.Load(); g != 0 || n != 0 {
		t.Fatalf("after every request ended: gauge %v, count %d; want 0", g, n)
	}
	if got := val(s.m.bodyRefused); got != 1 {
		t.Fatalf("refusals %v, want 1", got)
	}
}

// TestBodyBudgetChargesDecodedBody: a small gzip body is charged again at
// its decoded size, and refused when that would pass the budget; its
// partial charge is given back with the refusal.
func TestBodyBudgetChargesDecodedBody(t *testing.T) {
	slow := startFaultEngine(t, faultSlowStream)
	ok := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "slow", Model: "slow", URL: slow.url()}, StaticEngine{ID: "ok", Model: "m", URL: ok.url()})
	cfg.MaxBodyBytes, cfg.MaxBodyBytesInFlight = 1<<20, 1<<20
	cfg.MaxPromptTokens = 0
	s := startIngress(t, cfg, Deps{})
	url := "http://" + s.Addr() + "/v1/completions"

	const kib = 1 << 10
	openStream(t, url, paddedBody(t, "slow", true, 600*kib))
	gz := fasthttp.AppendGzipBytes(nil, []byte(paddedBody(t, "m", false, 500*kib)))
	if len(gz) > smallBody {
		t.Fatalf("gzip body %d bytes, want a small one", len(gz))
	}
	st, hdr, body := post(t, http.DefaultClient, url, string(gz), "Content-Encoding", "gzip")
	wantBudgetRefusal(t, st, hdr, body)
	if got := val(s.m.bodyBytes); got != 600*kib {
		t.Fatalf("bytes in flight after the refusal %v, want the stream's %d", got, 600*kib)
	}

	// A bomb (8 MiB of zeros in a few KiB, over the 1 MiB limit) is
	// decoded only as far as the budget has room: 503, not the 413 it would
	// get after decoding up to the limit, which would have held memory the
	// budget has no room for (150 zstd bombs took an ingress to 6 GB).
	bomb := fasthttp.AppendGzipBytes(nil, make([]byte, 8<<20))
	st, hdr, body = post(t, http.DefaultClient, url, string(bomb), "Content-Encoding", "gzip")
	wantBudgetRefusal(t, st, hdr, body)
	if got := val(s.m.bodyBytes); got != 600*kib {
		t.Fatalf("bytes in flight after the bomb %v, want the stream's %d", got, 600*kib)
	}
}

// decodeCharged charges a body's decoded bytes before decoding them: a
// first guess, doubled while the body decodes past it, up to the limit;
// the decoded body keeps its size charged. Many small bodies decode side by
// side (none reserves the whole limit); a step the budget has no room for
// is the budget's refusal, past the limit too large, and neither leaves a
// byte charged.
func TestDecodeCharged(t *testing.T) {
	const kib = 1 << 10
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.MaxBodyBytes, cfg.MaxBodyBytesInFlight = 4<<20, 8<<20
	s, err := New(cfg, Deps{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	var limits []int
	decodesTo := func(n int) func(int) ([]byte, error) {
		limits = limits[:0]
		return func(limit int) ([]byte, error) {
			limits = append(limits, limit)
			if n > limit {
				return nil, fasthttp.ErrBodyTooLarge
			}
			return make([]byte, n), nil
		}
	}
	for _, c := range []struct {
		name                string
		inFlight, held      int64
		compressed, decoded int
		wantErr, wantTooBig bool
		wantLimits          []int
	}{
		{"fits the first guess", 0, 2 * kib, 2 * kib, 40 * kib, false, false, []int{64 * kib}},
		{"guess from the compressed size", 0, 20 * kib, 20 * kib, 150 * kib, false, false, []int{160 * kib}},
		{"doubled to fit", 0, 2 * kib, 2 * kib, 300 * kib, false, false, []int{64 * kib, 128 * kib, 256 * kib, 512 * kib}},
		{"past the limit", 0, 2 * kib, 2 * kib, 5 << 20, true, true, []int{64 * kib, 128 * kib, 256 * kib, 512 * kib, 1 << 20, 2 << 20, 4 << 20}},
		{"no room for a step", 8<<20 - 100*kib, 2 * kib, 2 * kib, 300 * kib, true, false, []int{64 * kib}},
		{"full: what always passes", 8 << 20, 2 * kib, 2 * kib, 40 * kib, false, false, []int{62 * kib}},
	} {
		s.bodyBytes.Store(c.inFlight)
		b, charged, r, err := s.decodeCharged(c.held, c.compressed, cfg.MaxBodyBytes, decodesTo(c.decoded))
		if (err != nil) != c.wantErr || !slices.Equal(limits, c.wantLimits) {
			t.Errorf("%s: err %v, limits %v; want err %v, limits %v", c.name, err, limits, c.wantErr, c.wantLimits)
			continue
		}
		if err != nil {
			if s.bodyBytes.Load() != c.inFlight || charged != 0 {
				t.Errorf("%s: refused with %d in flight (charged %d), want %d", c.name, s.bodyBytes.Load(), charged, c.inFlight)
			}
			if tooBig := errors.Is(s.decodedRefused(r, cfg.MaxBodyBytes, "gzip"), ErrTooLarge); tooBig != c.wantTooBig {
				t.Errorf("%s: too large %v, want %v", c.name, tooBig, c.wantTooBig)
			}
			continue
		}
		if len(b) != c.decoded || charged != int64(c.decoded) || s.bodyBytes.Load() != c.inFlight+charged {
			t.Errorf("%s: %d bytes, charged %d, in flight %d; want %d charged over %d", c.name, len(b), charged, s.bodyBytes.Load(), c.decoded, c.inFlight)
		}
	}
	s.bodyBytes.Store(0)
	if err := s.decodedRefused(512*kib, cfg.MaxBodyBytes, "gzip"); !errors.Is(err, ErrBodyBudget) {
		t.Errorf("past the room: %v, want the budget's refusal", err)
	}
}

func TestBodyBudgetConfig(t *testing.T) {
	for _, tc := range []struct {
		body, inFlight int64
		ok             bool
	}{
		{32 << 20, 128 << 20, true},
		{32 << 20, 32 << 20, true},
		{32 << 20, 0, true}, // off
		{32 << 20, 16 << 20, false},
		{32 << 20, -1, false},
	} {
		cfg := DefaultConfig()
		cfg.MaxBodyBytes, cfg.MaxBodyBytesInFlight = int(tc.body), tc.inFlight
		if err := cfg.Validate(); (err == nil) != tc.ok {
			t.Errorf("max body %d, in flight %d: %v", tc.body, tc.inFlight, err)
		}
	}
	if d := DefaultConfig(); d.MaxBodyBytesInFlight != 128<<20 {
		t.Errorf("default %d", d.MaxBodyBytesInFlight)
	}
	cfg, err := ParseConfig([]byte("maxBodyBytesInFlight: 67108864\n"))
	if err != nil || cfg.MaxBodyBytesInFlight != 64<<20 {
		t.Errorf("YAML maxBodyBytesInFlight: %d, %v", cfg.MaxBodyBytesInFlight, err)
	}
}
