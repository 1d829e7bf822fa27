package epp

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/kvevents"
)

// benchRig is a picker over 8 static engines whose index holds a 1,024-token
// prefix on each (speculative entries with a long TTL stand for the
// materialized state); engines are never contacted: the stand-in only
// measures what the picker adds.
type benchRig struct {
	s    *Server
	env  *envoyStandIn
	body map[string][]byte
}

func newBenchRig(b testing.TB) *benchRig {
	testTokenizer(b) // fails the benchmark with the tokenizer's error
	r, stop, err := buildRig(nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(stop)
	r.env = newEnvoy(b, r.s.Addr(), extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
	return r
}

// buildRig starts the picker of a benchRig (no stand-in); stop closes it.
// The split-process benchmark's server child calls it outside a test, with
// onPick recording what the picker adds to each request.
func buildRig(onPick func(time.Duration)) (_ *benchRig, stop func(), _ error) {
	tokOnce.Do(loadTestTokenizer)
	if tokErr != nil {
		return nil, nil, fmt.Errorf("test tokenizer: %w", tokErr)
	}
	tk, err := ingress.NewTokenizer(tokNat, tokTpl)
	if err != nil {
		return nil, nil, err
	}
	cfg := ingress.DefaultConfig()
	cfg.Listen = "127.0.0.1:0"
	cfg.AccessLog = false
	cfg.Scheduler.Policy = "kvmesh"
	cfg.SpeculativeTTL = time.Hour
	cfg.MaxConcurrent = 100000
	for i := range 8 {
		cfg.Engines = append(cfg.Engines, ingress.StaticEngine{ID: fmt.Sprintf("e%d", i), Model: model, URL: fmt.Sprintf("http://10.0.0.%d:8000", i+1)})
	}
	idx, err := index.New(index.Config{SpeculativeTTL: time.Hour})
	if err != nil {
		return nil, nil, err
	}
	ids := make([]uint32, 1024)
	bodies := map[string][]byte{}
	root := kvevents.Root(model, "", "")
	for e := range 8 {
		for i := range ids {
			ids[i] = uint32(1000 + (e*7919+i)%28000) // within the tokenizer's 30,522-token vocabulary
		}
		idx.AddSpeculative(fmt.Sprintf("e%d", e), kvevents.AppendKeys(nil, root, ids, 16), time.Now())
	}
	var sb strings.Builder
	for i, id := range ids {
		if i > 0 {
			sb.WriteByte(',')
		}
		fmt.Fprint(&sb, id)
	}
	bodies["ids-1024"] = []byte(`{"model":"llama","prompt":[` + sb.String() + `,5,6,7],"max_tokens":64}`)
	text := words("bench", 700)
	bodies["text"] = []byte(completionsBody(text, false))
	bodies["chat"] = []byte(chatBody(words("bench-system", 600), "what now?", true))
	ing, err := ingress.New(cfg, ingress.Deps{Logger: quiet, AccessLog: quiet, Registry: prometheus.NewRegistry(), Index: idx,
		Tokenizers: ingress.TokenizerMap{model: tk}})
	if err != nil {
		return nil, nil, err
	}
	s, err := New(Config{Listen: "127.0.0.1:0", TLS: TLSOff, Logger: quiet}, Deps{Ingress: ing})
	if err != nil {
		return nil, nil, err
	}
	s.onPick = onPick
	if err := ing.Start(context.Background()); err != nil {
		return nil, nil, err
	}
	if err := s.Start(); err != nil {
		ing.Close()
		return nil, nil, err
	}
	stop = func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		s.Close(ctx)
		ing.Close()
	}
	return &benchRig{s: s, body: bodies}, stop, nil
}

// exchange plays one request the way Envoy does in full duplex and returns
// the time from the last request byte to the routing answer (what the
// picker adds before the upstream can be contacted) and the response
// headers' round trip.
func (r *benchRig) exchange(ctx context.Context, path string, body []byte) (route, resp time.Duration, err error) {
	st, err := r.env.client.Process(ctx)
	if err != nil {
		return 0, 0, err
	}
	h := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: r.env.headerMap([][2]string{{":method", "POST"}, {":path", path}, {"content-type", "application/json"}})}}}
	r.env.first(h)
	t0 := time.Now()
	if err := st.Send(h); err != nil {
		return 0, 0, err
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		return 0, 0, err
	}
	hr, err := st.Recv()
	if err != nil {
		return 0, 0, err
	}
	if hr.GetRequestHeaders() == nil {
		return 0, 0, fmt.Errorf("not routed: %v", hr)
	}
	if _, err := st.Recv(); err != nil {
		return 0, 0, err
	}
	route = time.Since(t0)
	set := hr.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	served, _, _ := strings.Cut(string(set[0].GetHeader().GetRawValue()), ",")
	t1 := time.Now()
	if err := st.Send(&extprocv3.ProcessingRequest{MetadataContext: servedMD(served), Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: r.env.headerMap([][2]string{{":status", "200"}}), EndOfStream: true}}}); err != nil {
		return 0, 0, err
	}
	if _, err := st.Recv(); err != nil {
		return 0, 0, err
	}
	resp = time.Since(t1)
	if err := st.CloseSend(); err != nil {
		return 0, 0, err
	}
	_, _ = st.Recv() // EOF
	return route, resp, nil
}

var servedCache sync.Map

func servedMD(ep string) *corev3.Metadata {
	if v, ok := servedCache.Load(ep); ok {
		return v.(*corev3.Metadata)
	}
	md := servedMetadata(nil, ep)
	servedCache.Store(ep, md)
	return md
}

var benchKinds = []struct{ name, path string }{
	{"ids-1024", "/v1/completions"}, {"text", "/v1/completions"}, {"chat", "/v1/chat/completions"},
}

// BenchmarkPick is the closed-loop cost of one routed request over
// loopback gRPC (request side and response headers), one stream per
// request as Envoy opens them.
func BenchmarkPick(b *testing.B) {
	r := newBenchRig(b)
	ctx := context.Background()
	for _, k := range benchKinds {
		b.Run(k.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			b.ReportAllocs()
			cpu0 := cpuTime()
			b.ResetTimer()
			for b.Loop() {
				route, _, err := r.exchange(ctx, k.path, r.body[k.name])
				if err != nil {
					b.Fatal(err)
				}
				lat = append(lat, route)
			}
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(len(lat)), "cpu-µs/op")
			reportPercentiles(b, "route", lat)
		})
	}
}

// BenchmarkPickAt1000RPS is the open-loop load: requests start every
// millisecond (1,000 req/s) whether or not earlier ones finished, for at
// least 3 s, and the p50/p99 of the routing answer's latency is reported.
// Run with -benchtime=1x.
func BenchmarkPickAt1000RPS(b *testing.B) {
	r := newBenchRig(b)
	for _, k := range benchKinds {
		b.Run(k.name, func(b *testing.B) {
			n := max(b.N, 3000)
			route := make([]time.Duration, n)
			resp := make([]time.Duration, n)
			errs := make(chan error, n)
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			tick := time.NewTicker(time.Millisecond)
			defer tick.Stop()
			var wg sync.WaitGroup
			cpu0, t0 := cpuTime(), time.Now()
			b.ResetTimer()
			for i := range n {
				<-tick.C
				wg.Add(1)
				go func() {
					defer wg.Done()
					var err error
					if route[i], resp[i], err = r.exchange(ctx, k.path, r.body[k.name]); err != nil {
						errs <- err
					}
				}()
			}
			wg.Wait()
			b.StopTimer()
			b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(n), "cpu-µs/op")
			b.ReportMetric(float64(n)/time.Since(t0).Seconds(), "req/s")
			close(errs)
			for err := range errs {
				b.Fatal(err)
			}
			reportPercentiles(b, "route", route)
			reportPercentiles(b, "resp", resp)
		})
	}
}

func reportPercentiles(b *testing.B, name string, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) float64 { return float64(s[min(len(s)-1, int(q*float64(len(s))))].Microseconds()) }
	b.ReportMetric(at(0.50), name+"-p50-µs")
	b.ReportMetric(at(0.99), name+"-p99-µs")
	b.ReportMetric(at(0.999), name+"-p999-µs")
}

// cpuTime is the process's user+system CPU time (picker and stand-in: they
// share the process, so per-request figures are an upper bound for the picker).
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkHandle is the picker's own work per request without gRPC: the
// exchange state machine fed the messages Envoy sends in full duplex
// (headers, body, response headers), the ingress's decision included.
func BenchmarkHandle(b *testing.B) {
	r := newBenchRig(b)
	for _, k := range benchKinds {
		b.Run(k.name, func(b *testing.B) {
			hdr := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
				Headers: r.env.headerMap([][2]string{{":method", "POST"}, {":path", k.path}, {"content-type", "application/json"}})}}}
			r.env.first(hdr)
			body := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: r.body[k.name], EndOfStream: true}}}
			resp := &extprocv3.ProcessingRequest{MetadataContext: servedMD("10.0.0.1:8000"), Request: &extprocv3.ProcessingRequest_ResponseHeaders{
				ResponseHeaders: &extprocv3.HttpHeaders{Headers: r.env.headerMap([][2]string{{":status", "200"}}), EndOfStream: true}}}
			b.ReportAllocs()
			cpu0, n := cpuTime(), 0
			for b.Loop() {
				n++
				x := r.s.xs.Get().(*exchange)
				x.reset()
				x.handle(hdr)
				x.out = x.out[:0]
				if x.handle(body) || len(x.out) != 2 {
					b.Fatalf("not routed: %v", x.out)
				}
				x.out = x.out[:0]
				x.handle(resp)
				x.end()
				r.s.xs.Put(x)
			}
			b.ReportMetric(float64((cpuTime()-cpu0).Nanoseconds())/1e3/float64(n), "cpu-µs/op")
		})
	}
}
