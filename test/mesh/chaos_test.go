//go:build chaos

package mesh

// `make chaos`: the whole mesh as separate processes on loopback — a NATS
// server (test/mesh/natsd), two simulated engines, two sidecars and two
// ingresses, all built from this tree — under sustained streaming load while
// faults are injected in turn. It prints a report per fault (see
// docs/RELIABILITY.md) and fails only when the mesh breaks outright; the
// figures are measurements, not assertions.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

const chaosModel = "chaos-model"

type proc struct {
	name string
	bin  string
	args []string
	logf *os.File
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *proc) start(t *testing.T) {
	t.Helper()
	p.cmd = exec.Command(p.bin, p.args...)
	p.cmd.Stdout, p.cmd.Stderr = p.logf, p.logf
	if err := p.cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", p.name, err)
	}
	p.done = make(chan struct{})
	go func(c *exec.Cmd, done chan struct{}) { _ = c.Wait(); close(done) }(p.cmd, p.done)
}

func (p *proc) kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// signal sends sig (SIGSTOP/SIGCONT: a hung process and its recovery).
func (p *proc) signal(sig syscall.Signal) { _ = p.cmd.Process.Signal(sig) }

type chaosMesh struct {
	t        *testing.T
	dir      string
	procs    []*proc
	nats     *proc
	natsPort int
	proxy    *testutil.Gate // ingress 1's way to NATS, which the run can cut
	engines  [2]*proc
	sidecars [2]*proc
	ingress  [2]*proc
	httpPort [2]int // engines
	scAdmin  [2]int
	inListen [2]int
	inAdmin  [2]int
}

// portPool hands out distinct free loopback ports: all are reserved (held
// open) at once and released together, so no two callers get the same one.
type portPool struct{ ports []int }

func newPortPool(t *testing.T, n int) *portPool {
	t.Helper()
	var lns []net.Listener
	p := &portPool{}
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		lns = append(lns, ln)
		p.ports = append(p.ports, ln.Addr().(*net.TCPAddr).Port)
	}
	for _, ln := range lns {
		ln.Close()
	}
	return p
}

func (p *portPool) next(t *testing.T) int {
	if len(p.ports) == 0 {
		t.Fatal("port pool exhausted")
	}
	n := p.ports[0]
	p.ports = p.ports[1:]
	return n
}

func buildBin(t *testing.T, dir, name, pkg string, extra ...string) string {
	t.Helper()
	out := filepath.Join(dir, name)
	args := append([]string{"build"}, extra...)
	args = append(args, "-o", out, pkg)
	cmd := exec.Command("go", args...)
	cmd.Dir = "../.."
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %s: %v\n%s", pkg, err, b)
	}
	return out
}

func (m *chaosMesh) newProc(name, bin string, args ...string) *proc {
	f, err := os.Create(filepath.Join(m.dir, name+".log"))
	if err != nil {
		m.t.Fatal(err)
	}
	p := &proc{name: name, bin: bin, args: args, logf: f}
	m.procs = append(m.procs, p)
	return p
}

func startChaosMesh(t *testing.T) *chaosMesh {
	dir := t.TempDir()
	if d := os.Getenv("CHAOS_LOGS"); d != "" { // keep the processes' logs
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		dir = d
	}
	m := &chaosMesh{t: t, dir: dir}
	kv := buildBin(t, dir, "kvmesh", "./cmd/kvmesh")
	natsd := buildBin(t, dir, "natsd", "./test/mesh/natsd", "-tags", "chaos")
	t.Cleanup(func() {
		for _, p := range m.procs {
			p.kill()
		}
	})

	pool := newPortPool(t, 32)
	freePort := func(t *testing.T) int { return pool.next(t) }
	m.natsPort = freePort(t)
	m.nats = m.newProc("nats", natsd, "-port", strconv.Itoa(m.natsPort), "-store", filepath.Join(dir, "js"))
	m.nats.start(t)
	natsURL := fmt.Sprintf("nats://127.0.0.1:%d", m.natsPort)
	waitTCP(t, m.natsPort)
	m.proxy = testutil.NewGate(t)
	m.proxy.Open(fmt.Sprintf("127.0.0.1:%d", m.natsPort))

	gossipPorts := []int{freePort(t), freePort(t), freePort(t), freePort(t)}
	join := func(self int) string {
		var s []string
		for i, p := range gossipPorts {
			if i != self {
				s = append(s, "127.0.0.1:"+strconv.Itoa(p))
			}
		}
		return strings.Join(s, ",")
	}
	for i := range 2 {
		m.httpPort[i] = freePort(t)
		events, replay := freePort(t), freePort(t)
		args := []string{"sim", "--model", chaosModel, "--http", "127.0.0.1:" + strconv.Itoa(m.httpPort[i]),
			"--kv-events", fmt.Sprintf("tcp://127.0.0.1:%d", events), "--kv-replay", fmt.Sprintf("tcp://127.0.0.1:%d", replay),
			"--time-scale", "20", "--block-size", "16", "--gpu-blocks", "1024", "--log-level", "warn"}
		if i == 1 {
			args = append(args, "--drop-rate", "0.05") // ZMQ batches dropped live all along: the sidecar replays them
		}
		m.engines[i] = m.newProc(fmt.Sprintf("engine%d", i), kv, args...)
		m.scAdmin[i] = freePort(t)
		m.sidecars[i] = m.newProc(fmt.Sprintf("sidecar%d", i), kv, "sidecar", "--model", chaosModel,
			"--engine-id", fmt.Sprintf("engine%d", i), "--engine-url", "http://127.0.0.1:"+strconv.Itoa(m.httpPort[i]),
			"--events", fmt.Sprintf("tcp://127.0.0.1:%d", events), "--bind-events", "--replay", fmt.Sprintf("tcp://127.0.0.1:%d", replay),
			"--block-size", "16", "--nats", natsURL, "--gossip-bind", "127.0.0.1:"+strconv.Itoa(gossipPorts[i]),
			"--join", join(i), "--gossip-profile", "local", "--admin", "127.0.0.1:"+strconv.Itoa(m.scAdmin[i]), "--log-level", "warn")
		m.sidecars[i].start(t) // binds the events endpoint the engine connects to
		m.engines[i].start(t)
	}
	for i := range 2 {
		m.inListen[i], m.inAdmin[i] = freePort(t), freePort(t)
		url := natsURL
		if i == 1 {
			url = "nats://" + m.proxy.Addr()
		}
		m.ingress[i] = m.newProc(fmt.Sprintf("ingress%d", i), kv, "ingress", "--listen", "127.0.0.1:"+strconv.Itoa(m.inListen[i]),
			"--admin", "127.0.0.1:"+strconv.Itoa(m.inAdmin[i]), "--gossip-bind", "127.0.0.1:"+strconv.Itoa(gossipPorts[2+i]),
			"--join", join(2+i), "--gossip-profile", "local", "--nats", url, "--policy", "kvmesh", "--log-level", "warn")
		m.ingress[i].start(t)
	}
	for i := range 2 {
		m.waitReady(fmt.Sprintf("ingress%d", i), fmt.Sprintf("http://127.0.0.1:%d/ready", m.inListen[i]))
		m.waitReady(fmt.Sprintf("sidecar%d", i), fmt.Sprintf("http://127.0.0.1:%d/ready", m.scAdmin[i]))
	}
	m.checkAlive()
	return m
}

// checkAlive fails the run when a process exited by itself.
func (m *chaosMesh) checkAlive() {
	for _, p := range m.procs {
		select {
		case <-p.done:
			b, _ := os.ReadFile(p.logf.Name())
			m.t.Fatalf("%s exited by itself:\n%s", p.name, tail(b, 2000))
		default:
		}
	}
}

func waitTCP(t *testing.T, port int) {
	testutil.WaitFor(t, 30*time.Second, fmt.Sprintf("port %d to accept", port), func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
}

func (m *chaosMesh) waitReady(what, url string) {
	testutil.WaitFor(m.t, 60*time.Second, what+" ready", func() bool {
		resp, err := http.Get(url)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
}

// indexConverged: every ingress's materialized key counts equal every
// sidecar's, per engine and tier.
func (m *chaosMesh) indexConverged() bool {
	want := map[string][3]int{}
	for i := range 2 {
		var st []struct {
			Engine string `json:"engine"`
			Keys   [3]int `json:"keys"`
		}
		if getJSON(fmt.Sprintf("http://127.0.0.1:%d/debug/state", m.scAdmin[i]), &st) != nil {
			return false
		}
		for _, s := range st {
			want[s.Engine] = s.Keys
		}
	}
	for i := range 2 {
		var idx struct {
			Engines []struct {
				Engine string
				Keys   [3]int
			} `json:"engines"`
		}
		if getJSON(fmt.Sprintf("http://127.0.0.1:%d/debug/index", m.inAdmin[i]), &idx) != nil {
			return false
		}
		got := map[string][3]int{}
		for _, e := range idx.Engines {
			if e.Keys != [3]int{} {
				got[e.Engine] = e.Keys
			}
		}
		for e, k := range want {
			if k != [3]int{} && got[e] != k {
				return false
			}
		}
		for e := range got {
			if _, ok := want[e]; !ok {
				return false
			}
		}
	}
	return len(want) == 2
}

// engineRequests sums both ingresses' request counters for one engine.
func (m *chaosMesh) engineRequests(engine string) uint64 {
	var n uint64
	for i := range 2 {
		var es []struct {
			ID       string `json:"ID"`
			Requests uint64 `json:"requests"`
		}
		if getJSON(fmt.Sprintf("http://127.0.0.1:%d/debug/engines", m.inAdmin[i]), &es) != nil {
			continue
		}
		for _, e := range es {
			if e.ID == engine {
				n += e.Requests
			}
		}
	}
	return n
}

func getJSON(url string, v any) error {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("%s: %d", url, resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// load is the sustained client traffic: streamed completions over shared
// prefixes, round-robin over both ingresses.
type chaosLoad struct {
	m       *chaosMesh
	phase   atomic.Pointer[string]
	paused  atomic.Bool
	down    atomic.Int32 // the ingress killed now, -1 none
	mu      sync.Mutex
	samples []string // bodies of broken streams and failures (first few)
	byPhase map[string]*phaseStats
}

type phaseStats struct {
	sent, ok, failedBeforeStream, brokenMidStream, deadIngress int
}

func (l *chaosLoad) stats(phase string) *phaseStats {
	if l.byPhase[phase] == nil {
		l.byPhase[phase] = &phaseStats{}
	}
	return l.byPhase[phase]
}

func (l *chaosLoad) run(ctx context.Context, workers int) *sync.WaitGroup {
	var wg sync.WaitGroup
	client := &http.Client{Timeout: 60 * time.Second}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			for i := 0; ctx.Err() == nil; i++ {
				if l.paused.Load() {
					select {
					case <-ctx.Done():
					case <-time.After(20 * time.Millisecond):
					}
					continue
				}
				in := (w + i) % 2
				l.one(ctx, client, in, rng)
			}
		}()
	}
	return &wg
}

func (l *chaosLoad) one(ctx context.Context, client *http.Client, in int, rng *rand.Rand) {
	phase := *l.phase.Load()
	var prompt []string
	g := rng.IntN(8)
	for j := range 48 { // a shared 32-token prefix (8 groups), then a private tail
		if j < 32 {
			prompt = append(prompt, strconv.Itoa(1000+g*100+j))
		} else {
			prompt = append(prompt, strconv.Itoa(rng.IntN(50000)))
		}
	}
	body := `{"model":"` + chaosModel + `","prompt":[` + strings.Join(prompt, ",") + `],"max_tokens":8,"stream":true}`
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, fmt.Sprintf("http://127.0.0.1:%d/v1/completions", l.m.inListen[in]), strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	l.mu.Lock()
	defer l.mu.Unlock()
	st := l.stats(phase)
	st.sent++
	if err != nil {
		if ctx.Err() != nil {
			st.sent--
			return
		}
		var op *net.OpError
		if ok := asOpError(err, &op); (ok && op.Op == "dial") || int32(in) == l.down.Load() {
			// The ingress process is down (or died with this request): a
			// load balancer's retry, not something the mesh can save.
			st.deadIngress++
			return
		}
		st.failedBeforeStream++
		l.note(phase, err.Error())
		return
	}
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		st.failedBeforeStream++
		l.note(phase, fmt.Sprintf("status %d: %.300s", resp.StatusCode, b))
		return
	}
	l.mu.Unlock()
	b, rerr := io.ReadAll(resp.Body)
	resp.Body.Close()
	l.mu.Lock()
	if !bytes.Contains(b, []byte("data: [DONE]")) || bytes.Contains(b, []byte(`{"error"`)) {
		if rerr != nil && ctx.Err() != nil { // the run ended under this stream
			st.sent--
			return
		}
		if int32(in) == l.down.Load() {
			st.deadIngress++
			return
		}
		// Counted where it broke: a stream that started in one phase and
		// broke when the next one's fault struck belongs to that fault.
		end := *l.phase.Load()
		l.stats(end).brokenMidStream++
		l.note(end, fmt.Sprintf("broken stream from %s via ingress%d (read error %v): …%s", resp.Header.Get("X-Kvmesh-Engine"), in, rerr, tail(b, 300)))
		return
	}
	st.ok++
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// note keeps the first few failure samples (mu held).
func (l *chaosLoad) note(phase, what string) {
	if len(l.samples) < 10 {
		l.samples = append(l.samples, phase+": "+what)
	}
}

func asOpError(err error, op **net.OpError) bool {
	for e := err; e != nil; {
		if o, ok := e.(*net.OpError); ok {
			*op = o
			return true
		}
		u, ok := e.(interface{ Unwrap() error })
		if !ok {
			return false
		}
		e = u.Unwrap()
	}
	return false
}

type faultResult struct {
	name           string
	noRouteToDead  time.Duration // -1: not applicable
	converge       time.Duration // after recovery
	convergeOK     bool
	stats          phaseStats
	faultWindowSec float64
}

func TestChaos(t *testing.T) {
	m := startChaosMesh(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	l := &chaosLoad{m: m, byPhase: map[string]*phaseStats{}}
	l.down.Store(-1)
	setPhase := func(p string) { l.phase.Store(&p) }
	setPhase("warmup")
	wg := l.run(ctx, 8)
	defer wg.Wait()
	defer cancel()
	settle := func() { // a few seconds of plain load between faults
		deadline := time.Now().Add(3 * time.Second)
		testutil.WaitFor(t, 10*time.Second, "the settle period", func() bool { return time.Now().After(deadline) })
	}
	settle()

	var results []faultResult
	converge := func(name string, recovered time.Time) (time.Duration, bool) {
		l.paused.Store(true)
		defer l.paused.Store(false)
		ok := false
		deadline := time.Now().Add(20 * time.Second)
		for time.Now().Before(deadline) {
			if m.indexConverged() {
				ok = true
				break
			}
			sleepPoll(25 * time.Millisecond)
		}
		return time.Since(recovered), ok
	}
	fault := func(name string, inject func() (dead string), recover func()) {
		setPhase(name)
		before := m.engineRequests("engine0") // the only engine a fault kills
		t0 := time.Now()
		dead := inject()
		r := faultResult{name: name, noRouteToDead: -1}
		if dead != "" {
			// The last attempt any ingress made on the dead engine, seen by
			// polling their request counters every 50 ms (the resolution).
			last, lastN := t0, before
			for end := time.Now().Add(5 * time.Second); time.Now().Before(end); sleepPoll(50 * time.Millisecond) {
				if n := m.engineRequests(dead); n != lastN {
					last, lastN = time.Now(), n
				}
			}
			r.noRouteToDead = last.Sub(t0)
		} else {
			deadline := time.Now().Add(3 * time.Second)
			for time.Now().Before(deadline) {
				sleepPoll(50 * time.Millisecond)
			}
		}
		recover()
		recovered := time.Now()
		r.faultWindowSec = recovered.Sub(t0).Seconds()
		r.converge, r.convergeOK = converge(name, recovered)
		setPhase(name + " (after)")
		settle()
		l.mu.Lock()
		r.stats = *l.stats(name)
		if a := l.byPhase[name+" (after)"]; a != nil {
			r.stats.failedBeforeStream += a.failedBeforeStream
			r.stats.brokenMidStream += a.brokenMidStream
			r.stats.sent += a.sent
			r.stats.ok += a.ok
			r.stats.deadIngress += a.deadIngress
		}
		l.mu.Unlock()
		results = append(results, r)
		t.Logf("%s: %+v", name, r)
	}

	fault("engine SIGKILL", func() string { m.engines[0].kill(); return "engine0" }, func() {
		m.engines[0].start(t)
		m.waitReady("engine0", fmt.Sprintf("http://127.0.0.1:%d/health", m.httpPort[0]))
		m.waitReady("sidecar0", fmt.Sprintf("http://127.0.0.1:%d/ready", m.scAdmin[0]))
	})
	// A hung engine: the process is frozen (SIGSTOP), its port still accepts
	// connections and nothing answers, until SIGCONT.
	fault("engine SIGSTOP (hung)", func() string { m.engines[0].signal(syscall.SIGSTOP); return "engine0" }, func() {
		m.engines[0].signal(syscall.SIGCONT)
		m.waitReady("engine0", fmt.Sprintf("http://127.0.0.1:%d/health", m.httpPort[0]))
		m.waitReady("sidecar0", fmt.Sprintf("http://127.0.0.1:%d/ready", m.scAdmin[0]))
	})
	fault("sidecar SIGKILL", func() string { m.sidecars[0].kill(); return "" }, func() {
		m.sidecars[0].start(t)
		m.waitReady("sidecar0", fmt.Sprintf("http://127.0.0.1:%d/ready", m.scAdmin[0]))
	})
	fault("ingress SIGKILL", func() string { l.down.Store(0); m.ingress[0].kill(); return "" }, func() {
		m.ingress[0].start(t)
		m.waitReady("ingress0", fmt.Sprintf("http://127.0.0.1:%d/ready", m.inListen[0]))
		l.down.Store(-1)
	})
	fault("NATS SIGKILL", func() string { m.nats.kill(); return "" }, func() {
		m.nats.start(t)
		waitTCP(t, m.natsPort)
		for i := range 2 {
			m.waitReady(fmt.Sprintf("sidecar%d", i), fmt.Sprintf("http://127.0.0.1:%d/ready", m.scAdmin[i]))
		}
	})
	fault("NATS SIGKILL, back without its store", func() string {
		m.nats.kill()
		// A NATS pod rescheduled onto an empty volume: the delta stream and
		// every consumer are gone.
		if err := os.RemoveAll(filepath.Join(m.dir, "js")); err != nil {
			t.Errorf("remove the NATS store: %v", err)
		}
		return ""
	}, func() {
		m.nats.start(t)
		waitTCP(t, m.natsPort)
		for i := range 2 {
			m.waitReady(fmt.Sprintf("sidecar%d", i), fmt.Sprintf("http://127.0.0.1:%d/ready", m.scAdmin[i]))
		}
	})
	fault("NATS partitioned from ingress1", func() string { m.proxy.Shut(); return "" }, func() { m.proxy.Open(fmt.Sprintf("127.0.0.1:%d", m.natsPort)) })

	m.checkAlive()
	// Soak: plain load, memory and goroutines sampled at both ends.
	setPhase("soak")
	soak := 60 * time.Second
	if s := os.Getenv("CHAOS_SOAK"); s != "" {
		if d, err := time.ParseDuration(s); err == nil {
			soak = d
		}
	}
	before := m.sample()
	for end := time.Now().Add(soak); time.Now().Before(end); sleepPoll(100 * time.Millisecond) {
	}
	after := m.sample()
	cancel()
	wg.Wait()

	l.mu.Lock()
	soakStats := *l.stats("soak")
	warm := *l.stats("warmup")
	l.mu.Unlock()
	report := chaosReport(results, warm, soakStats, soak, before, after)
	l.mu.Lock()
	for _, s := range l.samples {
		t.Log("sample failure: " + s)
	}
	l.mu.Unlock()
	fmt.Println(report)
	if p := os.Getenv("CHAOS_REPORT"); p != "" {
		if err := os.WriteFile(p, []byte(report), 0o644); err != nil {
			t.Error(err)
		}
	}
	if soakStats.ok == 0 {
		t.Fatal("no request succeeded during the soak: the mesh did not recover")
	}
}

// sleepPoll waits d (the chaos run's pacing; it is a program, not a unit test).
func sleepPoll(d time.Duration) { <-time.After(d) }

type sample struct {
	rss        [2]int64 // ingress KiB
	goroutines [2]int
	scRSS      [2]int64
	// cached prompt tokens the ingresses predicted and the engines reported
	// (kvmesh_ingress_cached_prompt_tokens_total), summed over both.
	predicted, reported float64
}

func (m *chaosMesh) sample() sample {
	var s sample
	for i := range 2 {
		s.rss[i] = rssKiB(m.ingress[i].pid())
		s.scRSS[i] = rssKiB(m.sidecars[i].pid())
		s.goroutines[i] = goroutines(fmt.Sprintf("http://127.0.0.1:%d/metrics", m.inAdmin[i]))
		p, e := cachedTokens(fmt.Sprintf("http://127.0.0.1:%d/metrics", m.inAdmin[i]))
		s.predicted += p
		s.reported += e
	}
	return s
}

// cachedTokens reads an ingress's kvmesh_ingress_cached_prompt_tokens_total
// series: the tokens it predicted cached and those the engines reported.
func cachedTokens(url string) (predicted, reported float64) {
	resp, err := http.Get(url)
	if err != nil {
		return -1, -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "kvmesh_ingress_cached_prompt_tokens_total{") {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		switch {
		case strings.Contains(line, `source="predicted"`):
			predicted += v
		case strings.Contains(line, `source="engine"`):
			reported += v
		}
	}
	return predicted, reported
}

func rssKiB(pid int) int64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return -1
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.ParseInt(f[1], 10, 64)
			return n
		}
	}
	return -1
}

func goroutines(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "go_goroutines "); ok {
			n, _ := strconv.ParseFloat(v, 64)
			return int(n)
		}
	}
	return -1
}

func chaosReport(rs []faultResult, warm, soak phaseStats, soakDur time.Duration, a, b sample) string {
	var w strings.Builder
	fmt.Fprintf(&w, "| fault | requests | failed before streaming | broken mid-stream | refused by the killed ingress | no request to the dead engine after | index equal again after recovery |\n")
	fmt.Fprintf(&w, "|---|---|---|---|---|---|---|\n")
	fmt.Fprintf(&w, "| none (warm-up) | %d | %d | %d | %d | — | — |\n", warm.sent, warm.failedBeforeStream, warm.brokenMidStream, warm.deadIngress)
	sort.SliceStable(rs, func(i, j int) bool { return false })
	for _, r := range rs {
		route := "—"
		if r.noRouteToDead >= 0 {
			route = r.noRouteToDead.Round(10 * time.Millisecond).String()
		}
		conv := r.converge.Round(10 * time.Millisecond).String()
		if !r.convergeOK {
			conv = "not within 20s"
		}
		fmt.Fprintf(&w, "| %s (%.1fs) | %d | %d | %d | %d | %s | %s |\n", r.name, r.faultWindowSec, r.stats.sent, r.stats.failedBeforeStream,
			r.stats.brokenMidStream, r.stats.deadIngress, route, conv)
	}
	fmt.Fprintf(&w, "\nSoak %v: %d requests, %d ok, %d failed before streaming, %d broken mid-stream.\n", soakDur, soak.sent, soak.ok, soak.failedBeforeStream, soak.brokenMidStream)
	if p, e := b.predicted-a.predicted, b.reported-a.reported; p > 0 {
		fmt.Fprintf(&w, "Cached prompt tokens over the soak (both ingresses): %.0f predicted by routing, %.0f reported by the engines (%.3f).\n", p, e, e/p)
	}
	for i := range 2 {
		fmt.Fprintf(&w, "ingress%d: RSS %d → %d KiB, goroutines %d → %d; sidecar%d: RSS %d → %d KiB\n", i, a.rss[i], b.rss[i], a.goroutines[i], b.goroutines[i], i, a.scRSS[i], b.scRSS[i])
	}
	return w.String()
}
