package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.yaml.in/yaml/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"k8s.io/apimachinery/pkg/api/resource"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

// TestEPPCommand runs `kvmesh epp` with a static engine, asks it for one
// route over ext_proc (full duplex, as a GAIE gateway's Envoy would; the
// client is a minimal stand-in, the epp package tests play Envoy fully) and
// stops it with SIGTERM.
func TestEPPCommand(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 500, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer sm.Close()
	var out, errOut testutil.SyncBuffer
	code := make(chan int, 1)
	go func() {
		code <- run([]string{"epp", "--grpc", "127.0.0.1:0", "--listen", "127.0.0.1:0", "--engine", "e1=m=" + sm.URL(),
			"--grpc-tls=off", "--log-level", "warn", "--access-log=false"}, &out, &errOut)
	}()
	addrRE := regexp.MustCompile(`ext_proc on (\S+),`)
	var addr string
	testutil.WaitFor(t, 10*time.Second, "the listening line", func() bool {
		select {
		case c := <-code:
			t.Fatalf("epp exited early with %d: %s", c, errOut.String())
		default:
		}
		if m := addrRE.FindStringSubmatch(out.String()); m != nil {
			addr = m[1]
			return true
		}
		return false
	})
	// JSON mode (the default): the banner is one JSON object too.
	var banner struct {
		Msg     string `json:"msg"`
		ExtProc string `json:"ext_proc"`
	}
	if err := json.Unmarshal([]byte(strings.TrimSpace(out.String())), &banner); err != nil || banner.ExtProc != addr || !strings.HasPrefix(banner.Msg, "kvmesh epp: ext_proc on ") {
		t.Fatalf("banner %q: %v", out.String(), err)
	}
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := extprocv3.NewExternalProcessorClient(conn).Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// As Envoy sends them: its connection manager gives every request an x-request-id.
	hdr := &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":method", RawValue: []byte("POST")}, {Key: ":path", RawValue: []byte("/v1/completions")},
		{Key: "x-request-id", RawValue: []byte("envoy-rid-1")}}}
	for _, m := range []*extprocv3.ProcessingRequest{
		{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdr}}},
		{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: []byte(`{"model":"m","prompt":[1,2,3]}`), EndOfStream: true}}},
	} {
		if err := st.Send(m); err != nil {
			t.Fatal(err)
		}
	}
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	want := strings.TrimPrefix(sm.URL(), "http://")
	set := r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()
	if len(set) != 1 || string(set[0].GetHeader().GetRawValue()) != want {
		t.Fatalf("answer %v, want destination %s", r, want)
	}
	st.CloseSend()
	conn.Close()
	if err := syscall.Kill(os.Getpid(), syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-code:
		if c != 0 {
			t.Fatalf("exit %d: %s", c, errOut.String())
		}
	case <-time.After(20 * time.Second):
		t.Fatal("epp did not stop on SIGTERM")
	}
}

func TestEPPCommandBadFlags(t *testing.T) {
	var out, errOut testutil.SyncBuffer
	code := run([]string{"epp", "--grpc", "nope", "--body-mode", "sideways", "--pool-name", "p", "--pool-namespace", "",
		"--max-endpoints", "-1", "--tokenizer", "no-equals", "--log-level", "loud", "--grpc-tls", "files", "--max-body", "300000000"}, &out, &errOut)
	if code != 2 {
		t.Fatalf("exit %d, want 2: %s", code, errOut.String())
	}
	for _, want := range []string{`--grpc "nope": want host:port`, `defaultBodyMode "sideways"`, `pool name needs its namespace`, `maxEndpoints`, `--tokenizer "no-equals"`, `--log-level "loud"`, `--grpc-tls=files needs --grpc-tls-cert and --grpc-tls-key`} {
		if !strings.Contains(errOut.String(), want) {
			t.Errorf("message lacks %q:\n%s", want, errOut.String())
		}
	}
	// An unbracketed IPv6 --grpc is named by its flag, not as "listen",
	// which is --listen's (tester h-ipv6 F6).
	var grpcErr testutil.SyncBuffer
	if code := run([]string{"epp", "--grpc", "::1:20370"}, io.Discard, &grpcErr); code != 2 || !strings.Contains(grpcErr.String(), `--grpc "::1:20370": want host:port, IPv6 in brackets`) {
		t.Errorf("--grpc ::1:20370: exit %d: %s", code, grpcErr.String())
	}
	// The picker buffers bodies against the ingress's in-flight bound, so a
	// --max-body above it is refused as on the ingress (a body that size
	// could never pass).
	if !strings.Contains(errOut.String(), "max body bytes in flight") {
		t.Errorf("epp takes a --max-body above --max-body-in-flight:\n%s", errOut.String())
	}
}

// TestGatewayManifestsUseRealFlags renders the gateway overlays and parses
// every kvmesh container's arguments with the binary's own flag sets. The
// picker connects to NATS with the ingress's credentials (the install's
// NATS admits named users only) and takes its tokenizers from the
// sidecars' object store as the ingress does, not from a local directory.
func TestGatewayManifestsUseRealFlags(t *testing.T) {
	kubectl := testutil.RequireTool(t, "kubectl", "it renders the gateway overlays")
	envRef := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, dir := range []string{"gateway/envoy-gateway", "gateway/istio"} {
		out, err := exec.Command(kubectl, "kustomize", filepath.Join("..", "..", "manifests", dir)).Output()
		if err != nil {
			t.Fatalf("kubectl kustomize %s: %v", dir, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(out))
		kinds := map[string]int{}
		sawEPP := false
		creds := map[string]string{} // command: its NATS user and password Secret key
		for {
			var doc map[string]any
			if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
				break
			} else if err != nil {
				t.Fatalf("%s: %v", dir, err)
			}
			kind, _ := doc["kind"].(string)
			kinds[kind]++
			for _, c := range containers(doc) {
				if image, _ := c["image"].(string); !strings.Contains(image, "kvmesh/kvmesh") {
					continue
				}
				var args []string
				for _, a := range c["args"].([]any) {
					args = append(args, envRef.ReplaceAllString(a.(string), "10.0.0.1"))
				}
				sawEPP = sawEPP || args[0] == "epp"
				creds[args[0]] = natsCredentials(args, c)
				if args[0] == "epp" {
					for _, a := range args {
						if strings.HasPrefix(a, "--tokenizer=") || strings.HasPrefix(a, "--chat-template=") || a == "--tokenizer-store=false" {
							t.Errorf("%s: the picker reads a tokenizer from a local path (%s), not from the object store as the ingress", dir, a)
						}
					}
				}
				var stdout, stderr bytes.Buffer
				if code := run(append(args, "-h"), &stdout, &stderr); code != 0 {
					t.Errorf("%s: kvmesh %s rejects its manifest arguments (exit %d): %s", dir, strings.Join(args, " "), code, stderr.String())
				}
			}
		}
		if !sawEPP || kinds["InferencePool"] != 1 || kinds["HTTPRoute"] != 1 || kinds["CustomResourceDefinition"] < 1 {
			t.Fatalf("%s: epp container %v, kinds %v", dir, sawEPP, kinds)
		}
		if creds["ingress"] == "" || creds["epp"] != creds["ingress"] {
			t.Errorf("%s: the picker's NATS credentials %q, the ingress's %q", dir, creds["epp"], creds["ingress"])
		}
	}
}

// TestEPPManifestMemory: the picker's Deployment bounds the request bodies
// it buffers (--max-body-in-flight on), has a memory limit that holds them
// at their worst-case cost beside the steady state (docs/OPERATIONS.md's
// sizing: about 15 × the bound; the memory request as the steady state),
// and sets the Go GC's soft limit to about 90 % of it, as the ingress does.
func TestEPPManifestMemory(t *testing.T) {
	const bodyCost = 15
	raw, err := os.ReadFile(filepath.Join("..", "..", "manifests", "gateway", "base", "epp.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	envRef := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	found := false
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		if doc["kind"] != "Deployment" {
			continue
		}
		for _, c := range containers(doc) {
			if c["name"] != "epp" {
				continue
			}
			found = true
			var args []string
			for _, a := range c["args"].([]any) {
				args = append(args, envRef.ReplaceAllString(a.(string), "10.0.0.1"))
			}
			opts, err := eppOptions(args[1:], io.Discard)
			if err != nil {
				t.Fatalf("kvmesh %s: %v", strings.Join(args, " "), err)
			}
			budget := opts.Ingress.Config.MaxBodyBytesInFlight
			if budget <= 0 {
				t.Fatalf("--max-body-in-flight %d: the picker's bodies are unbounded", budget)
			}
			res, _ := c["resources"].(map[string]any)
			limits, _ := res["limits"].(map[string]any)
			requests, _ := res["requests"].(map[string]any)
			limit, err := resource.ParseQuantity(fmt.Sprint(limits["memory"]))
			if err != nil {
				t.Fatalf("limits.memory %v: %v", limits["memory"], err)
			}
			steady, err := resource.ParseQuantity(fmt.Sprint(requests["memory"]))
			if err != nil {
				t.Fatalf("requests.memory %v: %v", requests["memory"], err)
			}
			gml := ""
			for _, e := range c["env"].([]any) {
				if e, _ := e.(map[string]any); e["name"] == "GOMEMLIMIT" {
					gml, _ = e["value"].(string)
				}
			}
			soft, err := resource.ParseQuantity(strings.TrimSuffix(gml, "B")) // Go's MiB is Kubernetes' Mi
			if gml == "" || err != nil {
				t.Fatalf("GOMEMLIMIT %q (%v): want about 90 %% of limits.memory %s", gml, err, limit.String())
			}
			if r := float64(soft.Value()) / float64(limit.Value()); r < 0.85 || r > 0.95 {
				t.Errorf("GOMEMLIMIT %s is %.0f %% of limits.memory %s; want about 90 %%", gml, 100*r, limit.String())
			}
			if need := steady.Value() + bodyCost*budget; need > soft.Value() {
				t.Errorf("GOMEMLIMIT %s holds less than the steady state (requests.memory %s) and %d × the body bound %d (%d bytes)",
					gml, steady.String(), bodyCost, budget, need)
			}
		}
	}
	if !found {
		t.Fatal("no epp container in manifests/gateway/base/epp.yaml")
	}
}

// natsCredentials is a kvmesh container's --nats-user and the Secret key its
// $KVMESH_NATS_PASSWORD comes from ("" without either).
func natsCredentials(args []string, c map[string]any) string {
	var user string
	for _, a := range args {
		if u, ok := strings.CutPrefix(a, "--nats-user="); ok {
			user = u
		}
	}
	env, _ := c["env"].([]any)
	for _, e := range env {
		em, _ := e.(map[string]any)
		if em["name"] != "KVMESH_NATS_PASSWORD" {
			continue
		}
		vf, _ := em["valueFrom"].(map[string]any)
		ref, _ := vf["secretKeyRef"].(map[string]any)
		if user == "" || ref["name"] == nil || ref["optional"] == true {
			return ""
		}
		return fmt.Sprintf("%s %v/%v", user, ref["name"], ref["key"])
	}
	return ""
}

// `kvmesh epp -h` describes --admin as the picker's: it has no client
// port, only --listen (docs/GATEWAY.md, "Flags").
func TestEPPAdminHelp(t *testing.T) {
	usage := func(args ...string) string {
		var b bytes.Buffer
		_, _ = eppOptions(args, &b)
		return b.String()
	}
	help := usage("-h")
	i := strings.Index(help, "-admin string")
	if i < 0 {
		t.Fatalf("no --admin in the help:\n%s", help)
	}
	admin := help[i:]
	if j := strings.Index(admin[1:], "\n  -"); j >= 0 {
		admin = admin[:j+1]
	}
	if strings.Contains(admin, "client port") || !strings.Contains(admin, "/metrics stays on --listen") {
		t.Errorf("epp --admin help: %s", admin)
	}
}
