package mesh

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
)

// latencyIndex records, for every stored key, the time from the engine
// publishing the event that created it to the key being visible here.
type latencyIndex struct {
	mu      sync.Mutex
	born    *sync.Map // key → time.Time the engine published it (shared)
	samples []time.Duration
	keys    int
}

func (x *latencyIndex) Store(_ string, _ kvevents.Tier, keys []uint64) {
	now := time.Now()
	x.mu.Lock()
	defer x.mu.Unlock()
	for _, k := range keys {
		if t, ok := x.born.Load(k); ok {
			x.samples = append(x.samples, now.Sub(t.(time.Time)))
		}
	}
	x.keys += len(keys)
}
func (x *latencyIndex) Remove(string, kvevents.Tier, []uint64) {}
func (x *latencyIndex) ClearEngine(string)                     {}

// BenchmarkPropagation drives 16 engines' KV-event publishers directly at a
// sustained rate (each batch stores 4 new blocks and evicts 4 old ones),
// through 16 sidecars and NATS into 4 materializers, and reports the
// propagation latency from engine publish to visible in an ingress index.
// Run with -benchtime 1x: the run length is fixed (benchDuration).
func BenchmarkPropagation(b *testing.B) {
	for _, rate := range []int{50, 250} {
		b.Run(fmt.Sprintf("batches-per-engine-per-s=%d", rate), func(b *testing.B) { benchPropagation(b, rate) })
	}
}

func benchPropagation(b *testing.B, batchesPerSec int) {
	const (
		engines       = 16
		ingresses     = 4
		blocks        = 4 // stored (and evicted) per batch
		bs            = 16
		benchDuration = 5 * time.Second
		warmup        = time.Second // first sight of every engine goes through a snapshot: not the steady state
	)
	ns := startNATS(b)
	born := &sync.Map{}
	var idxs []*latencyIndex
	var stops []func()
	for i := 0; i < ingresses; i++ {
		nc, err := nats.Connect(ns.directURL())
		if err != nil {
			b.Fatal(err)
		}
		idx := &latencyIndex{born: born}
		cfg := materialize.DefaultConfig()
		cfg.Conn, cfg.Index = nc, idx
		m, err := materialize.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { _ = m.Run(ctx); close(done) }()
		idxs = append(idxs, idx)
		stops = append(stops, func() { cancel(); <-done; nc.Close() })
	}
	defer func() {
		for _, s := range stops {
			s()
		}
	}()

	type drv struct {
		pub  *kvtest.Publisher
		root uint64
	}
	var drivers []drv
	for i := 0; i < engines; i++ {
		pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"})
		if err != nil {
			b.Fatal(err)
		}
		defer pub.Close()
		model := fmt.Sprintf("bench-%d", i)
		cfg := sidecar.DefaultConfig()
		cfg.Engines = []sidecar.EngineConfig{{ID: fmt.Sprintf("e%02d", i), Model: model, Events: pub.Endpoint(), Replay: pub.ReplayEndpoint(), MetricsURL: "-"}}
		cfg.NATS = natsConfig(ns.directURL())
		s, err := sidecar.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = s.Run(context.Background()); close(done) }()
		defer func() { _ = s.Close(); <-done }()
		testutil.WaitFor(b, 10*time.Second, "sidecar ready", s.Ready)
		drivers = append(drivers, drv{pub, kvevents.Root(model, "", "")})
	}

	b.ResetTimer()
	start := time.Now()
	var wg sync.WaitGroup
	var sent sync.Map
	for i, d := range drivers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(time.Second / time.Duration(batchesPerSec))
			defer tick.Stop()
			tokens := make([]uint32, blocks*bs)
			var hist [][]uint64 // engine hashes of past batches, evicted 8 batches later
			n, counted := 0, 0
			for time.Since(start) < benchDuration {
				<-tick.C
				for j := range tokens {
					tokens[j] = uint32(i<<24 | n<<8 | j)
				}
				keys := kvevents.AppendKeys(nil, d.root, tokens, bs)
				hashes := make([]uint64, blocks)
				for j := range hashes {
					hashes[j] = uint64(i)<<48 | uint64(n)<<8 | uint64(j)
				}
				ev := []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: tokens, BlockSize: bs}}
				if len(hist) >= 8 {
					ev = append(ev, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: hist[0]})
					hist = hist[1:]
				}
				hist = append(hist, hashes)
				now := time.Now()
				if now.Sub(start) >= warmup {
					for _, k := range keys {
						born.Store(k, now)
					}
					counted++
				}
				if _, err := d.pub.Publish(&kvevents.Batch{TS: float64(now.UnixNano()) / 1e9, Events: ev}); err != nil {
					b.Error(err)
					return
				}
				n++
			}
			sent.Store(i, counted)
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	// Let the last deltas arrive.
	deadline := time.Now().Add(5 * time.Second)
	total := 0
	sent.Range(func(_, v any) bool { total += v.(int) * blocks; return true })
	poll := time.NewTicker(20 * time.Millisecond)
	defer poll.Stop()
	for ; time.Now().Before(deadline); <-poll.C {
		ok := true
		for _, x := range idxs {
			x.mu.Lock()
			if len(x.samples) < total {
				ok = false
			}
			x.mu.Unlock()
		}
		if ok {
			break
		}
	}
	b.StopTimer()
	var all []time.Duration
	for _, x := range idxs {
		all = append(all, x.samples...)
	}
	if len(all) == 0 {
		b.Fatal("no samples")
	}
	slices.Sort(all)
	pct := func(p float64) float64 { return float64(all[int(p*float64(len(all)-1))].Microseconds()) }
	b.ReportMetric(pct(0.50), "p50-µs")
	b.ReportMetric(pct(0.99), "p99-µs")
	b.ReportMetric(pct(1.0), "max-µs")
	b.ReportMetric(float64(total)/(elapsed-warmup).Seconds(), "stored-keys/s/ingress")
	b.ReportMetric(float64(len(all))/float64(total*ingresses), "delivered-fraction")
}
