package epp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"runtime"
	"runtime/pprof"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The split-process benchmark runs the picker and the Envoy stand-in as two
// processes of this test binary, each pinned to its own core with taskset and
// GOMAXPROCS=1: a gateway's Envoy and its endpoint picker run in different
// pods and never share a CPU budget, while the in-process benchmarks above
// make the stand-in's gRPC client compete with the picker for the same two
// cores. The parent process only starts the children and reads their output.
const (
	splitRole    = "KVMESH_EPP_SPLIT_ROLE" // "server" or "client"
	splitAddr    = "KVMESH_EPP_SPLIT_ADDR"
	splitKind    = "KVMESH_EPP_SPLIT_KIND"
	splitN       = "KVMESH_EPP_SPLIT_N"
	splitRate    = "KVMESH_EPP_SPLIT_RATE"
	splitProfile = "KVMESH_EPP_SPLIT_CPUPROFILE" // the server child writes a CPU profile there
	splitWarm    = 200                           // warm-up requests before the measured ones
)

func TestMain(m *testing.M) {
	switch role := os.Getenv(splitRole); role {
	case "":
		os.Exit(m.Run())
	case "server":
		os.Exit(splitServer())
	case "noop":
		os.Exit(noopServer())
	case "client":
		os.Exit(splitClient())
	default:
		fmt.Fprintf(os.Stderr, "%s: unknown role %q\n", splitRole, role)
		os.Exit(2)
	}
}

// addedLog collects a server child's per-request "added" times (message
// that completes the request received → routing answer handed to Send).
type addedLog struct {
	mu sync.Mutex
	d  []time.Duration
}

func (l *addedLog) add(d time.Duration) {
	l.mu.Lock()
	l.d = append(l.d, d)
	l.mu.Unlock()
}

// report prints the quantiles of the measured requests (the first splitWarm
// are the client's sequential warm-up) as the child's last stdout line.
func (l *addedLog) report() {
	l.mu.Lock()
	defer l.mu.Unlock()
	var res serverResult
	if len(l.d) > splitWarm {
		res.Requests = len(l.d) - splitWarm
		res.Added = quantiles(l.d[splitWarm:])
	}
	_ = json.NewEncoder(os.Stdout).Encode(res)
}

// serverResult is what a server child reports when its stdin closes.
type serverResult struct {
	Requests int     `json:"requests"`
	Added    []int64 `json:"added_ns"` // p50, p99, p99.9
}

// splitServer serves the bench rig's picker, prints its address and stops
// when stdin closes (the parent's end of the pipe: it cannot outlive it),
// then prints what it added to the requests.
func splitServer() int {
	log := &addedLog{d: make([]time.Duration, 0, 1<<16)}
	r, stop, err := buildRig(log.add)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer stop()
	if f := os.Getenv(splitProfile); f != "" { // a CPU profile of the picker process
		w, err := os.Create(f)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer w.Close()
		if err := pprof.StartCPUProfile(w); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		defer pprof.StopCPUProfile()
	}
	fmt.Printf("addr %s\n", r.s.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	log.report()
	return 0
}

// noopEPP answers Envoy's full-duplex exchange as the picker does — the
// destination header and metadata, the body passed back, an empty answer to
// the response headers — with a fixed endpoint and no decision: the floor
// of the protocol over gRPC, against which the picker's cost is read.
type noopEPP struct {
	extprocv3.UnimplementedExternalProcessorServer
	log *addedLog
}

func (n noopEPP) Process(st extprocv3.ExternalProcessor_ProcessServer) error {
	var body []byte
	for {
		req, err := st.Recv()
		if err != nil {
			return nil // EOF or cancel: the stream is over
		}
		t := time.Now()
		var out []*extprocv3.ProcessingResponse
		switch v := req.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, v.RequestBody.GetBody()...)
			if v.RequestBody.GetEndOfStream() {
				r := headersResponse(routeCommon("10.0.0.1:8000", ""))
				r.DynamicMetadata = destinationMetadata("10.0.0.1:8000")
				out = append(out, r, bodyResponse(streamedBody(body, true)))
				body = body[:0]
				n.log.add(time.Since(t))
			}
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			out = append(out, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{}}})
		}
		for _, r := range out {
			if err := st.Send(r); err != nil {
				return err
			}
		}
	}
}

// noopServer serves noopEPP like splitServer serves the picker.
func noopServer() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log := &addedLog{d: make([]time.Duration, 0, 1<<16)}
	gs := grpc.NewServer(transportOptions()...)
	extprocv3.RegisterExternalProcessorServer(gs, noopEPP{log: log})
	go func() { _ = gs.Serve(ln) }() // stopped below, before return
	fmt.Printf("addr %s\n", ln.Addr())
	_, _ = io.Copy(io.Discard, os.Stdin)
	gs.Stop()
	log.report()
	return 0
}

// splitResult is what the client child reports as JSON on stdout.
type splitResult struct {
	Requests   int     `json:"requests"`
	Errors     int     `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	RPS        float64 `json:"rps"`
	CPUus      float64 `json:"cpu_us_per_req"`
	Route      []int64 `json:"route_ns"` // p50, p99, p99.9
	Resp       []int64 `json:"resp_ns"`
}

// splitClient plays Envoy in full duplex at an open-loop rate: request i
// starts at i/rate whether or not earlier ones finished.
func splitClient() int {
	n, _ := strconv.Atoi(os.Getenv(splitN))
	rate, _ := strconv.Atoi(os.Getenv(splitRate))
	kind := os.Getenv(splitKind)
	if n <= 0 || rate <= 0 {
		fmt.Fprintln(os.Stderr, "client: bad N or rate")
		return 2
	}
	var path string
	for _, k := range benchKinds {
		if k.name == kind {
			path = k.path
		}
	}
	bodies, err := splitBodies()
	if err != nil || path == "" || bodies[kind] == nil {
		fmt.Fprintf(os.Stderr, "client: kind %q: %v\n", kind, err)
		return 2
	}
	conn, err := grpc.NewClient(os.Getenv(splitAddr), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer conn.Close()
	full := extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED
	r := &benchRig{env: &envoyStandIn{conn: conn, client: extprocv3.NewExternalProcessorClient(conn), reqMode: full, respMode: full}}
	ctx := context.Background()
	for range splitWarm { // warm the connection, the pools and the picker's caches
		if _, _, err := r.exchange(ctx, path, bodies[kind]); err != nil {
			fmt.Fprintln(os.Stderr, "warm-up:", err)
			return 1
		}
	}
	route, resp := make([]time.Duration, n), make([]time.Duration, n)
	var (
		mu    sync.Mutex
		nerr  int
		first string
		wg    sync.WaitGroup
	)
	interval := time.Second / time.Duration(rate)
	runtime.GC()
	cpu0, t0 := cpuTime(), time.Now()
	pace := time.NewTimer(0) // the open loop's schedule: request i at t0 + i·interval
	defer pace.Stop()
	<-pace.C
	for i := range n {
		if d := time.Until(t0.Add(time.Duration(i) * interval)); d > 0 {
			pace.Reset(d)
			<-pace.C
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			if route[i], resp[i], err = r.exchange(ctx, path, bodies[kind]); err != nil {
				mu.Lock()
				if nerr++; first == "" {
					first = err.Error()
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	el := time.Since(t0)
	res := splitResult{Requests: n, Errors: nerr, FirstError: first, RPS: float64(n) / el.Seconds(),
		CPUus: float64((cpuTime() - cpu0).Microseconds()) / float64(n), Route: quantiles(route), Resp: quantiles(resp)}
	if err := json.NewEncoder(os.Stdout).Encode(res); err != nil {
		return 1
	}
	return 0
}

// splitBodies are the rig's request bodies without starting a picker.
func splitBodies() (map[string][]byte, error) {
	r, stop, err := buildRig(nil)
	if err != nil {
		return nil, err
	}
	stop()
	return r.body, nil
}

func quantiles(lat []time.Duration) []int64 {
	s := append([]time.Duration(nil), lat...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	at := func(q float64) int64 { return int64(s[min(len(s)-1, int(q*float64(len(s))))]) }
	return []int64{at(0.50), at(0.99), at(0.999)}
}

// procCPU is a process's user+system CPU time from /proc (clock ticks of
// 10 ms: enough over thousands of requests).
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:]) // fields from 3 (state) on
	if len(f) < 13 {
		return 0, fmt.Errorf("short /proc/%d/stat", pid)
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64) // field 14
	st, err2 := strconv.ParseInt(f[12], 10, 64) // field 15
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("parse /proc/%d/stat", pid)
	}
	return time.Duration(ut+st) * 10 * time.Millisecond, nil
}

// procSyscalls is a process's count of read and write system calls so far
// (/proc/PID/io syscr, syscw; 0, 0 where that is not readable).
func procSyscalls(pid int) (reads, writes int64) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/io", pid))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, ": ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "syscr":
			reads = n
		case "syscw":
			writes = n
		}
	}
	return reads, writes
}

// splitCmd is this test binary in a child role, pinned to cpu when taskset
// is available.
func splitCmd(taskset string, cpu int, env ...string) *exec.Cmd {
	var cmd *exec.Cmd
	if taskset != "" {
		cmd = exec.Command(taskset, "-c", strconv.Itoa(cpu), os.Args[0], "-test.run=^$")
	} else {
		cmd = exec.Command(os.Args[0], "-test.run=^$")
	}
	cmd.Env = append(os.Environ(), append([]string{"GOMAXPROCS=1"}, env...)...)
	cmd.Stderr = os.Stderr
	return cmd
}

// startSplitServer starts a server child (role "server": the picker;
// "noop": noopEPP) pinned to cpu and returns its address, its pid and a
// stop function that closes its stdin, reads its report and waits for it.
func startSplitServer(b *testing.B, taskset, role string) (addr string, pid int, stop func() serverResult) {
	srv := splitCmd(taskset, 1, splitRole+"="+role)
	in, err := srv.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	out, err := srv.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		b.Fatal(err)
	}
	rd := bufio.NewReader(out)
	stop = func() serverResult {
		in.Close()
		var res serverResult
		_ = json.NewDecoder(rd).Decode(&res) // zero when the child died first
		_ = srv.Wait()
		return res
	}
	line, err := rd.ReadString('\n')
	addr, ok := strings.CutPrefix(strings.TrimSpace(line), "addr ")
	if err != nil || !ok {
		stop()
		b.Fatalf("%s child: %q %v", role, line, err)
	}
	return addr, srv.Process.Pid, stop
}

// BenchmarkPickSplit1000RPS is BenchmarkPickAt1000RPS with the picker and the
// Envoy stand-in in separate processes on separate cores (GOMAXPROCS=1
// each): route = last request byte sent → routing answer received, which is
// what the picker adds to a request (both gRPC stacks included). The same
// load against noopEPP (server=noop: the same protocol answers with a fixed
// endpoint and no decision) is the transport's floor; the picker's own cost
// is the difference. Run with -benchtime=1x; KVMESH_EPP_SPLIT_N requests per
// prompt kind (default 5,000).
func BenchmarkPickSplit1000RPS(b *testing.B) {
	taskset, _ := exec.LookPath("taskset")
	if runtime.NumCPU() < 2 {
		taskset = ""
	}
	n := 5000
	if v, err := strconv.Atoi(os.Getenv(splitN)); err == nil && v > 0 {
		n = v
	}
	for _, k := range benchKinds {
		for _, role := range []string{"noop", "server"} {
			b.Run(k.name+"/server="+role, func(b *testing.B) {
				addr, pid, stop := startSplitServer(b, taskset, role)
				stopped := false
				defer func() {
					if !stopped {
						stop()
					}
				}()
				cli := splitCmd(taskset, 0, splitRole+"=client", splitAddr+"="+addr, splitKind+"="+k.name,
					splitN+"="+strconv.Itoa(n), splitRate+"=1000")
				s0, _ := procCPU(pid)
				r0, w0 := procSyscalls(pid)
				outb, err := cli.Output()
				if err != nil {
					b.Fatalf("client child: %v", err)
				}
				s1, _ := procCPU(pid)
				r1, w1 := procSyscalls(pid)
				var res splitResult
				if err := json.Unmarshal(outb, &res); err != nil {
					b.Fatalf("client child output %q: %v", outb, err)
				}
				if res.Errors > 0 {
					b.Fatalf("%d of %d requests failed, first: %s", res.Errors, res.Requests, res.FirstError)
				}
				b.ReportMetric(res.RPS, "req/s")
				b.ReportMetric(float64((s1-s0).Microseconds())/float64(res.Requests+splitWarm), "server-cpu-µs/op")
				b.ReportMetric(float64(r1-r0)/float64(res.Requests+splitWarm), "server-reads/op")
				b.ReportMetric(float64(w1-w0)/float64(res.Requests+splitWarm), "server-writes/op")
				b.ReportMetric(res.CPUus, "client-cpu-µs/op")
				for i, q := range []string{"p50", "p99", "p999"} {
					b.ReportMetric(float64(res.Route[i])/1e3, "route-"+q+"-µs")
				}
				stopped = true
				if sr := stop(); len(sr.Added) == 3 {
					// Server side: the body's last message received → the
					// routing answer handed to Send (what the picker adds on
					// top of the transport; near zero for the no-op server).
					b.ReportMetric(float64(sr.Added[0])/1e3, "added-p50-µs")
					b.ReportMetric(float64(sr.Added[1])/1e3, "added-p99-µs")
					b.ReportMetric(float64(sr.Added[2])/1e3, "added-p999-µs")
				}
			})
		}
	}
}
