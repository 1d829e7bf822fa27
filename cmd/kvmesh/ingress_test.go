package main

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

// TestIngressCommand runs `kvmesh ingress` through run() in front of an
// in-process simulator, sends one completion, then stops it the way a
// deployment does (SIGTERM, caught by run's signal context) and checks it
// drained, exited 0 and left no goroutine behind.
func TestIngressCommand(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sm.Close()
	before := goroutines()

	var out, errOut testutil.SyncBuffer
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"ingress", "--listen", "127.0.0.1:0", "--engine", "e1=m=" + sm.URL(),
			"--drain-timeout", "5s", "--log-level", "warn", "--access-log=false"}, &out, &errOut)
	}()
	addrRE := regexp.MustCompile(`listening on (http://\S+)`)
	var base string
	testutil.WaitFor(t, 10*time.Second, "the listening line", func() bool {
		select {
		case c := <-code:
			t.Fatalf("ingress exited early with %d: %s", c, errOut.String())
		default:
		}
		if m := addrRE.FindStringSubmatch(out.String()); m != nil {
			base = m[1]
			return true
		}
		return false
	})

	tr := &http.Transport{}
	client := &http.Client{Transport: tr, Timeout: 10 * time.Second}
	resp, err := client.Post(base+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"m","prompt":[1,2,3,4,5,6,7,8],"max_tokens":4}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		Object  string `json:"object"`
		Choices []struct {
			Text string `json:"text"`
		} `json:"choices"`
		Usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(body, &got); err != nil || resp.StatusCode != 200 {
		t.Fatalf("%d %s: %v", resp.StatusCode, body, err)
	}
	if got.Object != "text_completion" || len(got.Choices) != 1 || got.Usage.PromptTokens != 8 || got.Usage.CompletionTokens != 4 ||
		resp.Header.Get("X-Kvmesh-Engine") != "e1" {
		t.Fatalf("answer %s (engine %q)", body, resp.Header.Get("X-Kvmesh-Engine"))
	}
	tr.CloseIdleConnections()

	// run registered its signal context before printing the address, so
	// the signal goes to that context and not to the test binary's default.
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("exit %d: %s", c, errOut.String())
		}
	case <-time.After(15 * time.Second):
		t.Fatal("ingress did not stop on SIGTERM")
	}
	if !strings.Contains(out.String(), "draining") {
		t.Fatalf("stdout %q", out.String())
	}
	// JSON mode (the default): every stdout line but the listening banner
	// (which orchestrator/local reads as text) is a JSON object.
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		var m map[string]any
		if !strings.HasPrefix(l, "kvmesh ingress listening on ") && json.Unmarshal([]byte(l), &m) != nil {
			t.Fatalf("stdout line not JSON: %q", l)
		}
	}
	// Upstream pool cleaners exit after their idle period (5 s).
	deadline := time.Now().Add(20 * time.Second)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for goroutines() > before {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines left over, %d before:\n%s", goroutines(), before, buf[:runtime.Stack(buf, true)])
		}
		<-tick.C
	}
}

// goroutines counts live goroutines except os/signal's receive loop, which
// the first signal.Notify starts for the life of the process.
func goroutines() int {
	buf := make([]byte, 1<<20)
	st := string(buf[:runtime.Stack(buf, true)])
	return strings.Count("\n"+st, "\ngoroutine ") - strings.Count(st, "os/signal.signal_recv")
}

// Bad flags: exit status 2 and every problem in one message.
func TestIngressCommandBadFlags(t *testing.T) {
	var out, errOut testutil.SyncBuffer
	code := run([]string{"ingress", "--listen", "nope", "--engine", "only-one-part", "--tokenizer", "no-equals",
		"--chat-mode", "sideways", "--max-attempts", "0", "--log-level", "loud", "--key-input-tpm", "-1",
		"--gossip-key", "!!", "--log-format", "logfmt"}, &out, &errOut)
	if code != 2 {
		t.Fatalf("exit %d, want 2: %s", code, errOut.String())
	}
	msg := errOut.String()
	for _, want := range []string{`(--listen, listen) "nope"`, `engine "only-one-part"`, `--tokenizer "no-equals"`, `chat mode`, `max attempts`,
		`--log-level "loud"`, `--key-input-tpm must be >= 0`, `--gossip-key`, `--log-format "logfmt"`} {
		if !strings.Contains(msg, want) {
			t.Errorf("message lacks %q:\n%s", want, msg)
		}
	}
	if strings.Count(msg, "\n") != 1 {
		t.Errorf("want the problems on one line: %q", msg)
	}

	// An unknown flag stops the parser: exit 2 as well.
	if code := run([]string{"ingress", "--no-such-flag"}, &out, &errOut); code != 2 {
		t.Fatalf("unknown flag: exit %d", code)
	}
}

// A flag whose feature the configuration leaves off is refused by name
// (it would be ignored); with the feature on (by flag or by --config) the
// same flag is read.
func TestIngressFlagsNotRead(t *testing.T) {
	base := []string{"--engine", "m=http://127.0.0.1:1"}
	fairYAML := filepath.Join(t.TempDir(), "fair.yaml")
	if err := os.WriteFile(fairYAML, []byte("fairQueue:\n  maxConcurrent: 8\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want []string // each refused flag's problem; none: accepted
	}{
		{[]string{"--admit-max-wait", "5s"}, []string{"--admit-max-wait is not read without --admit-max"}},
		{[]string{"--admit-max", "4", "--admit-max-wait", "5s"}, nil},
		{[]string{"--fair-max-concurrent", "4", "--admit-max", "4"}, []string{"--admit-max is not read with fair admission on"}},
		{[]string{"--config", fairYAML, "--admit-max", "4", "--admit-max-wait", "1s"},
			[]string{"--admit-max is not read with fair admission on", "--admit-max-wait is not read with fair admission on"}},
		{[]string{"--tenant-header", "X-Tenant"}, []string{"--tenant-header is not read without fair admission"}},
		{[]string{"--tenant", "a=1", "--tenant-header", "X-Tenant"}, nil},
		{[]string{"--config", fairYAML, "--tenant-header", "X-Tenant"}, nil},
		{[]string{"--admin-token", "s3cret"}, []string{"--admin-token is not read without --admin"}},
		{[]string{"--admin", "127.0.0.1:0", "--admin-token", "s3cret"}, nil},
		{[]string{"--jwt-audience", "a", "--jwt-issuer", "i", "--jwt-tenant-claim", "t"},
			[]string{"--jwt-audience is not read without --jwks-file", "--jwt-issuer is not read", "--jwt-tenant-claim is not read"}},
		{[]string{"--pd-transfer-gbps", "10"}, []string{"--pd-transfer-gbps is not read without --pd-policy"}},
		{[]string{"--pd-policy", "kvmesh", "--pd-transfer-gbps", "10"}, nil},
		{[]string{"--routes-optional"}, []string{"--routes-optional is not read without --routes"}},
		{[]string{"--tokenizer-cache", "/tmp/x", "--nats-user", "u", "--nats-tls-insecure"},
			[]string{"--tokenizer-cache is not read without --nats", "--nats-user is not read without --nats", "--nats-tls-insecure is not read without --nats"}},
		{[]string{"--nats", "nats://127.0.0.1:1", "--tokenizer-store=false", "--tokenizer-cache", "/tmp/x"},
			[]string{"--tokenizer-cache is not read without --tokenizer-store"}},
		{[]string{"--nats", "nats://127.0.0.1:1", "--tokenizer-cache", "/tmp/x", "--nats-user", "u"}, nil},
		{[]string{"--tokenizer-store"}, []string{"--tokenizer-store is not read without --nats"}},
		{[]string{"--tokenizer-store=false"}, nil},
		{[]string{"--gossip-advertise", "10.0.0.1", "--gossip-profile", "wan", "--gossip-key", "MDEyMzQ1Njc4OWFiY2RlZg=="},
			[]string{"--gossip-advertise is not read without --gossip-bind", "--gossip-profile is not read", "--gossip-key is not read"}},
		{[]string{"--gossip-bind", "127.0.0.1:0", "--gossip-advertise", "10.0.0.1", "--gossip-profile", "wan"}, nil},
	} {
		_, err := ingressOptions(ingressArgs(base, c.args), io.Discard)
		checkRefused(t, c.args, err, c.want)
	}

	// kvmesh epp shares the flags and the rule: exit 2 (--listen nope
	// makes it exit 2 even were the rule gone, not serve).
	var out, errOut testutil.SyncBuffer
	if code := run([]string{"epp", "--listen", "nope", "--admit-max-wait", "5s"}, &out, &errOut); code != 2 ||
		!strings.Contains(errOut.String(), "--admit-max-wait is not read without --admit-max") {
		t.Errorf("epp: exit %d: %s", code, errOut.String())
	}
}

// checkRefused checks the error a command line args gave: nil when want is
// empty, else a usage error naming each of want (substrings of its
// problems) and refusing exactly len(want) flags as not read.
// ingressArgs is base then args, without base (its static engines) when
// args turn gossip on: the sidecars' gossip lists the engines then
// (TestStaticEnginesWithGossipRefused).
func ingressArgs(base, args []string) []string {
	if slices.Contains(args, "--gossip-bind") {
		return args
	}
	return append(append([]string(nil), base...), args...)
}

func checkRefused(t *testing.T, args []string, err error, want []string) {
	t.Helper()
	if len(want) == 0 {
		if err != nil {
			t.Errorf("%v: %v", args, err)
		}
		return
	}
	if !errors.Is(err, errUsage) {
		t.Errorf("%v: err %v, want a usage error", args, err)
		return
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v: %q lacks %q", args, err, w)
		}
	}
	if n := strings.Count(err.Error(), "is not read"); n != len(want) {
		t.Errorf("%v: %d flags refused, want %d: %v", args, n, len(want), err)
	}
}

// --engine-header (default on, config engineHeader) turns X-Kvmesh-Engine
// off with =false; the flag wins over the config file.
func TestEngineHeaderFlag(t *testing.T) {
	cf := filepath.Join(t.TempDir(), "ingress.yaml")
	if err := os.WriteFile(cf, []byte("engineHeader: false\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	base := []string{"--engine", "m=http://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		on   bool
	}{
		{nil, true},
		{[]string{"--engine-header=false"}, false},
		{[]string{"--config", cf}, false},
		{[]string{"--config", cf, "--engine-header"}, true},
	} {
		o, err := ingressOptions(append(append([]string(nil), base...), c.args...), io.Discard)
		if err != nil || o.Config.EngineHeader != c.on {
			t.Errorf("%v: engine header %v, err %v; want %v", c.args, o.Config.EngineHeader, err, c.on)
		}
	}
}
