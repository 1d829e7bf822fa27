package ingress

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/sim"
)

// Side-by-side benchmarks (docs/BENCHMARKS.md): the same simulated
// engines called directly, through the ingress, and through nginx doing
// round-robin proxy_pass. The sims run at a huge time scale so model time is
// ~0 and what is left is HTTP and proxy overhead.

const benchBody = `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32],"max_tokens":1}`

const benchStreamBody = `{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32],"max_tokens":4,"stream":true}`

type benchRig struct {
	sims []*sim.Server
	ingr string // host:port of the ingress
	// ingrLog is a second ingress with the default access log on (its JSON
	// line per request written to a pipe): the line's cost, side by side.
	ingrLog string
	nginx   string // host:port, "" when nginx is missing
	direct  string
}

func newBenchRig(b *testing.B, policy string) *benchRig {
	b.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	r := &benchRig{}
	for i := 0; i < 2; i++ {
		s, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 1e6, Seed: uint64(i + 1), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		r.sims = append(r.sims, s)
	}
	r.direct = r.sims[0].HTTPAddr()
	r.ingr = startIngressProcess(b, policy, false, "s0=m="+r.sims[0].URL(), "s1=m="+r.sims[1].URL())
	r.ingrLog = startIngressProcess(b, policy, true, "s0=m="+r.sims[0].URL(), "s1=m="+r.sims[1].URL())
	r.nginx = startNginx(b, r.sims[0].HTTPAddr(), r.sims[1].HTTPAddr())
	return r
}

// startIngressProcess runs `kvmesh ingress` as its own process, like nginx,
// so the two proxies compete on equal terms (neither shares the test
// process's scheduler and garbage collector with the sims and the client).
func startIngressProcess(b *testing.B, policy string, accessLog bool, engines ...string) string {
	b.Helper()
	dir := b.TempDir()
	bin := filepath.Join(dir, "kvmesh")
	build := exec.Command("go", "build", "-o", bin, "github.com/kvmesh/kvmesh/cmd/kvmesh")
	if out, err := build.CombinedOutput(); err != nil {
		b.Fatalf("build kvmesh: %v\n%s", err, out)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	args := []string{"ingress", "-listen", addr, "-policy", policy, "-access-log=" + strconv.FormatBool(accessLog)}
	for _, e := range engines {
		args = append(args, "-engine", e)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
	})
	if !answersHealth(addr, 10*time.Second) {
		b.Fatalf("kvmesh ingress not answering on %s", addr)
	}
	return addr
}

// startNginx runs nginx from a temp dir with a generated config doing
// round-robin proxy_pass to upstreams; "" when nginx is not installed.
func startNginx(b *testing.B, upstreams ...string) string {
	bin, err := exec.LookPath("nginx")
	if err != nil {
		if _, err2 := os.Stat("/usr/sbin/nginx"); err2 != nil {
			return ""
		}
		bin = "/usr/sbin/nginx"
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := b.TempDir()
	var ups strings.Builder
	for _, u := range upstreams {
		fmt.Fprintf(&ups, "    server %s;\n", u)
	}
	conf := fmt.Sprintf(`worker_processes auto;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream sims {
%[2]s    keepalive 256;
  }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://sims;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
    }
  }
}
`, dir, ups.String(), addr)
	cf := filepath.Join(dir, "nginx.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(bin, "-p", dir, "-c", cf, "-e", filepath.Join(dir, "error.log"))
	cmd.Stderr = io.Discard
	// Its own process group, so the workers can be stopped with the master:
	// a killed master leaves its workers running.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.Logf("nginx did not start: %v", err)
		return ""
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM) // fast shutdown: the master stops its workers
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) // whatever is left of the group
		<-done
	})
	if !answersHealth(addr, 5*time.Second) {
		b.Logf("nginx not answering on %s", addr)
		return ""
	}
	return addr
}

// answersHealth polls addr's /health until it answers 200 or timeout passes.
func answersHealth(addr string, timeout time.Duration) bool {
	hc := &fasthttp.HostClient{Addr: addr}
	deadline := time.Now().Add(timeout)
	tk := time.NewTicker(10 * time.Millisecond)
	defer tk.Stop()
	for time.Now().Before(deadline) {
		if st, _, err := hc.Get(nil, "http://"+addr+"/health"); err == nil && st == 200 {
			return true
		}
		<-tk.C
	}
	return false
}

func (r *benchRig) targets() []struct{ name, addr string } {
	t := []struct{ name, addr string }{{"direct", r.direct}, {"ingress", r.ingr}, {"ingress-accesslog", r.ingrLog}}
	if r.nginx != "" {
		t = append(t, struct{ name, addr string }{"nginx", r.nginx})
	}
	return t
}

func doOnce(hc *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response) error {
	if err := hc.Do(req, resp); err != nil {
		return err
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
	}
	return nil
}

func doOnceLB(lb *fasthttp.LBClient, req *fasthttp.Request, resp *fasthttp.Response) error {
	if err := lb.Do(req, resp); err != nil {
		return err
	}
	if resp.StatusCode() != 200 {
		return fmt.Errorf("status %d: %s", resp.StatusCode(), resp.Body())
	}
	return nil
}

func newReq(addr, body string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://" + addr + "/v1/completions")
	req.Header.SetMethod("POST")
	req.Header.SetContentType("application/json")
	req.SetBodyString(body)
	return req
}

// BenchmarkAddedLatency sends sequential requests, one at a time, to every
// target in turn (direct, ingress, nginx: interleaved so machine noise hits
// all alike) and reports each one's p50/p99; ingress minus direct is the
// latency the ingress adds (token-id prompts: no tokenization).
func BenchmarkAddedLatency(b *testing.B) {
	for _, mode := range []struct{ name, body string }{{"nonstream", benchBody}, {"stream", benchStreamBody}} {
		b.Run(mode.name, func(b *testing.B) {
			r := newBenchRig(b, "kvmesh")
			tgs := r.targets()
			hcs := make([]*fasthttp.HostClient, len(tgs))
			reqs := make([]*fasthttp.Request, len(tgs))
			lat := make([][]time.Duration, len(tgs))
			resp := fasthttp.AcquireResponse()
			for i, tg := range tgs {
				hcs[i] = &fasthttp.HostClient{Addr: tg.addr, MaxConns: 4}
				reqs[i] = newReq(tg.addr, mode.body)
				for j := 0; j < 50; j++ { // warm up connections and pools
					if err := doOnce(hcs[i], reqs[i], resp); err != nil {
						b.Fatal(err)
					}
				}
				lat[i] = make([]time.Duration, 0, b.N)
			}
			b.ResetTimer()
			for n := 0; n < b.N; n++ {
				for k := range tgs {
					i := (n + k) % len(tgs)
					t0 := time.Now()
					if err := doOnce(hcs[i], reqs[i], resp); err != nil {
						b.Fatal(err)
					}
					lat[i] = append(lat[i], time.Since(t0))
				}
			}
			b.StopTimer()
			pct := func(l []time.Duration, p int) float64 {
				slices.Sort(l)
				return float64(l[min(len(l)-1, len(l)*p/100)].Microseconds())
			}
			d50, d99 := pct(lat[0], 50), pct(lat[0], 99)
			for i, tg := range tgs {
				p50, p99 := pct(lat[i], 50), pct(lat[i], 99)
				b.ReportMetric(p50, tg.name+"-p50-µs")
				b.ReportMetric(p99, tg.name+"-p99-µs")
				if i > 0 {
					b.ReportMetric(p50-d50, tg.name+"-added-p50-µs")
					b.ReportMetric(p99-d99, tg.name+"-added-p99-µs")
				}
			}
		})
	}
}

// BenchmarkThroughput drives each target with 64 concurrent clients and
// reports requests per second.
func BenchmarkThroughput(b *testing.B) {
	r := newBenchRig(b, "kvmesh")
	tgs := r.targets()
	// "direct" spreads over both sims from the client, like the proxies do.
	tgs[0].addr = r.sims[0].HTTPAddr() + "," + r.sims[1].HTTPAddr()
	for _, tg := range tgs {
		b.Run(tg.name, func(b *testing.B) {
			lb := &fasthttp.LBClient{}
			for _, a := range strings.Split(tg.addr, ",") {
				lb.Clients = append(lb.Clients, &fasthttp.HostClient{Addr: a, MaxConns: 256})
			}
			var failed atomic.Int64
			b.SetParallelism(32) // x GOMAXPROCS goroutines
			b.ResetTimer()
			t0 := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				req := newReq(strings.Split(tg.addr, ",")[0], benchBody)
				resp := fasthttp.AcquireResponse()
				for pb.Next() {
					if err := doOnceLB(lb, req, resp); err != nil {
						failed.Add(1)
					}
				}
			})
			b.ReportMetric(float64(b.N)/time.Since(t0).Seconds(), "req/s")
			if f := failed.Load(); f > 0 {
				b.Fatalf("%d requests failed", f)
			}
		})
	}
}
