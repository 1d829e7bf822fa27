package epp

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// counter reads one series of a registry ("" labels: the unlabelled one).
func counter(t *testing.T, reg *prometheus.Registry, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	next:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				if !hasLabel(m, labels[i], labels[i+1]) {
					continue next
				}
			}
			if m.Counter != nil {
				return m.Counter.GetValue()
			}
			return m.GetGauge().GetValue()
		}
	}
	return 0
}

func hasLabel(m *dto.Metric, k, v string) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == k && l.GetValue() == v {
			return true
		}
	}
	return false
}

// checkImmediate checks a refusal: status, OpenAI error body, JSON content type.
func checkImmediate(t *testing.T, res *exchangeResult, status int, code string) {
	t.Helper()
	ir := res.immediate
	if ir == nil {
		t.Fatalf("routed to %q, want an immediate %d", res.dest, status)
	}
	if int(ir.GetStatus().GetCode()) != status {
		t.Fatalf("immediate status %d, want %d (%s)", ir.GetStatus().GetCode(), status, ir.GetBody())
	}
	var e struct {
		Error struct{ Message, Type, Code string }
	}
	if err := json.Unmarshal(ir.GetBody(), &e); err != nil || e.Error.Message == "" || (code != "" && e.Error.Code != code) {
		t.Fatalf("error body %s (want code %q): %v", ir.GetBody(), code, err)
	}
	ct := false
	for _, h := range ir.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "content-type" && string(h.GetHeader().GetRawValue()) == "application/json" {
			ct = true
		}
	}
	if !ct || ir.GetDetails() == "" || strings.ContainsAny(ir.GetDetails(), " \t") {
		t.Fatalf("immediate headers %v details %q", ir.GetHeaders(), ir.GetDetails())
	}
}

func TestPickerProtocol(t *testing.T) {
	rig := newPickerRig(t)
	m := rig.m
	ctx := context.Background()
	duplex := newEnvoy(t, rig.s.Addr(), extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
	bodyA := []byte(completionsBody(rig.textA+" subset question", false))

	t.Run("subset narrows the ranking", func(t *testing.T) {
		// eng-b holds the chat prefix; without a hint the chat goes there.
		chat := []byte(chatBody(rig.sysB, "subset turn", false))
		res, err := duplex.do(ctx, httpRequest{method: "POST", path: "/v1/chat/completions", body: chat}, false)
		if err != nil {
			t.Fatal(err)
		}
		checkRouting(t, res, m.ep["eng-b"], 2)
		// The gateway allows eng-a only.
		res, err = duplex.do(ctx, httpRequest{method: "POST", path: "/v1/chat/completions", body: chat, subset: []string{m.ep["eng-a"]}}, false)
		if err != nil {
			t.Fatal(err)
		}
		checkRouting(t, res, m.ep["eng-a"], 1)
	})
	t.Run("subset with no eligible endpoint is 503", func(t *testing.T) {
		for _, subset := range [][]string{{"10.255.0.1:8000"}, {}} {
			res, err := duplex.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: bodyA, subset: subset, subsetSet: true}, false)
			if !errors.Is(err, errImmediate) {
				t.Fatalf("subset %v: no refusal: %v", subset, err)
			}
			checkImmediate(t, res, 503, "service_unavailable")
		}
	})
	t.Run("the ingress's refusals pass through", func(t *testing.T) {
		cases := []struct {
			body   string
			status int
			code   string
		}{
			{`{"model":"no-such-model","prompt":"hi"}`, 404, "model_not_found"},
			{`{"model":"llama","prompt":`, 400, ""},
			{`[1,2]`, 400, ""},
		}
		for _, c := range cases {
			res, err := duplex.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: []byte(c.body)}, false)
			if !errors.Is(err, errImmediate) {
				t.Fatalf("%s: %v", c.body, err)
			}
			checkImmediate(t, res, c.status, c.code)
		}
	})
	t.Run("bodyless requests route on load", func(t *testing.T) {
		res, err := duplex.do(ctx, httpRequest{method: "GET", path: "/health"}, true)
		if err != nil {
			t.Fatal(err)
		}
		if got := strings.Split(res.dest, ","); len(got) != 2 || m.eng[got[0]] == "" || m.eng[got[1]] == "" {
			t.Fatalf("destination %q", res.dest)
		}
		if res.status != 200 {
			t.Fatalf("/health through the picked endpoint: %d %s", res.status, res.respBody)
		}
	})
	t.Run("a message without a phase ends the stream with InvalidArgument", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(ctx, 30*time.Second) // unanswered, the stream would wait for good
		defer cancel()
		st, err := duplex.client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := st.Send(&extprocv3.ProcessingRequest{}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Recv(); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("answer to an empty ProcessingRequest: %v, want InvalidArgument", err)
		}
	})
	t.Run("STREAMED without send_body_without_waiting is refused clearly", func(t *testing.T) {
		env := newEnvoy(t, rig.s.Addr(), extprocfilter.ProcessingMode_STREAMED, extprocfilter.ProcessingMode_STREAMED)
		env.noWait = false
		st, err := env.client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		h := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
			Headers: env.headerMap([][2]string{{":method", "POST"}, {":path", "/v1/completions"}})}}}
		env.first(h)
		if err := st.Send(h); err != nil {
			t.Fatal(err)
		}
		r := recvOK(t, st)
		checkImmediate(t, &exchangeResult{immediate: r.GetImmediateResponse()}, 500, "epp_misconfigured")
	})
	t.Run("no protocol_config: the configured default mode", func(t *testing.T) {
		env := newEnvoy(t, rig.s.Addr(), extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
		env.noConfig = true
		res, err := env.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: bodyA}, true)
		if err != nil {
			t.Fatal(err)
		}
		checkRouting(t, res, m.ep["eng-a"], 2)
	})
	t.Run("client-sent destination headers are overwritten", func(t *testing.T) {
		res, err := duplex.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: bodyA,
			headers: [][2]string{{DestinationKey, "6.6.6.6:80"}, {PrefillerHeader, "6.6.6.6:80"}}}, false)
		if err != nil {
			t.Fatal(err)
		}
		checkRouting(t, res, m.ep["eng-a"], 2) // overwrite action, prefiller removed
	})
	t.Run("served fallback moves the charge", func(t *testing.T) {
		before := counter(t, rig.r.reg, "kvmesh_epp_served_fallback_total")
		st, err := duplex.client.Process(ctx)
		if err != nil {
			t.Fatal(err)
		}
		sendAll(t, st, duplex, bodyA)
		hr := recvOK(t, st)
		dest := string(hr.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders()[0].GetHeader().GetRawValue())
		eps := strings.Split(dest, ",")
		recvOK(t, st) // body
		if len(eps) != 2 || eps[0] != m.ep["eng-a"] {
			t.Fatalf("destination %q", dest)
		}
		// The data plane could not reach eng-a and served from eng-b.
		respondServed(t, st, eps[1])
		if got := counter(t, rig.r.reg, "kvmesh_epp_served_fallback_total"); got != before+1 {
			t.Fatalf("served_fallback_total %v, want %v", got, before+1)
		}
		var views []engineView
		if !getJSON("http://"+rig.r.ing.AdminAddr()+"/debug/engines", &views) {
			t.Fatal("debug/engines")
		}
		for _, v := range views {
			want := 0
			if v.ID == "eng-b" {
				want = 1
			}
			if v.LocalInFlight != want {
				t.Fatalf("%s local in-flight %d, want %d (the charge follows the served endpoint)", v.ID, v.LocalInFlight, want)
			}
		}
		endResponse(t, st)
		testutil.WaitFor(t, 10*time.Second, "the charge released", func() bool { return settled(rig.r) })
	})
	t.Run("health", func(t *testing.T) {
		conn, err := grpc.NewClient(rig.s.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		hc := healthpb.NewHealthClient(conn)
		if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: HealthLiveness}); err != nil || resp.GetStatus() != healthpb.HealthCheckResponse_SERVING {
			t.Fatalf("liveness: %v %v", resp, err)
		}
		// Readiness follows the index's sync (re-evaluated every ReadyInterval).
		for _, svc := range []string{HealthReadiness, ExtProcService, ""} {
			testutil.WaitFor(t, 10*time.Second, "health "+svc+" SERVING", func() bool {
				resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
				return err == nil && resp.GetStatus() == healthpb.HealthCheckResponse_SERVING
			})
		}
		if resp, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: "no-such-service"}); err == nil {
			t.Fatalf("unknown service answered %v", resp)
		}
	})
	testutil.WaitFor(t, 10*time.Second, "nothing left charged", func() bool { return settled(rig.r) })
	if got := counter(t, rig.r.reg, "kvmesh_epp_streams"); got != 0 {
		t.Fatalf("%v streams still open", got)
	}
}

// TestShedding: the ingress's concurrency bound answers 429 with Retry-After
// while a picked request is still in flight, and routes again after.
func TestShedding(t *testing.T) {
	m := newMesh(t)
	s, r := m.startEPP("epp-shed", DefaultConfig(), Deps{}, func(c *ingress.Config) { c.MaxConcurrent = 1 })
	m.addEngine("eng-a", "", 1)
	m.waitEngines(r, 1)
	env := newEnvoy(t, s.Addr(), extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
	ctx := context.Background()
	body := []byte(completionsBody("hold the only slot", false))
	st, err := env.client.Process(ctx)
	if err != nil {
		t.Fatal(err)
	}
	sendAll(t, st, env, body)
	recvOK(t, st)
	recvOK(t, st) // routed; its response has not started

	res, err := env.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: body}, false)
	if !errors.Is(err, errImmediate) {
		t.Fatalf("second request: %v", err)
	}
	checkImmediate(t, res, 429, "")
	retry := ""
	for _, h := range res.immediate.GetHeaders().GetSetHeaders() {
		if h.GetHeader().GetKey() == "retry-after" {
			retry = string(h.GetHeader().GetRawValue())
		}
	}
	if retry != "1" {
		t.Fatalf("retry-after %q", retry)
	}
	respondServed(t, st, m.ep["eng-a"])
	endResponse(t, st)
	res, err = env.do(ctx, httpRequest{method: "POST", path: "/v1/completions", body: body}, true)
	if err != nil {
		t.Fatal(err)
	}
	checkRouting(t, res, m.ep["eng-a"], 1)
	if got := counter(t, r.reg, "kvmesh_epp_immediate_responses_total", "status", "429"); got != 1 {
		t.Fatalf("immediate 429 counted %v", got)
	}
}

// sendAll sends headers and the body (one end-of-stream chunk) in full duplex.
func sendAll(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, env *envoyStandIn, body []byte) {
	t.Helper()
	h := &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{
		Headers: env.headerMap([][2]string{{":method", "POST"}, {":path", "/v1/completions"}})}}}
	env.first(h)
	if err := st.Send(h); err != nil {
		t.Fatal(err)
	}
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
		RequestBody: &extprocv3.HttpBody{Body: body, EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
}

func recvOK(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient) *extprocv3.ProcessingResponse {
	t.Helper()
	r, err := st.Recv()
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// respondServed plays the response headers with the served endpoint.
func respondServed(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient, served string) {
	t.Helper()
	env := &envoyStandIn{}
	md := servedMetadata(t, served)
	if err := st.Send(&extprocv3.ProcessingRequest{MetadataContext: md, Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: env.headerMap([][2]string{{":status", "200"}})}}}); err != nil {
		t.Fatal(err)
	}
	recvOK(t, st)
}

// endResponse sends the last response body chunk and closes the stream.
func endResponse(t *testing.T, st extprocv3.ExternalProcessor_ProcessClient) {
	t.Helper()
	if err := st.Send(&extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseBody{
		ResponseBody: &extprocv3.HttpBody{Body: []byte(`{}`), EndOfStream: true}}}); err != nil {
		t.Fatal(err)
	}
	recvOK(t, st)
	if err := st.CloseSend(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err == nil {
		t.Fatal("stream still open")
	}
}
