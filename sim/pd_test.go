package sim

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Every test here runs real HTTP, the real side channel (loopback TCP) and
// real ZMQ events; nothing is faked.

const waitLong = 20 * time.Second

func nixlConfig(c *Config) {
	c.PD.KVTransfer = &KVTransferConfig{KVConnector: "NixlConnector", KVRole: "kv_both"}
}

// pdResponse is a completion with vLLM's kv_transfer_params.
type pdResponse struct {
	openai.Completion
	KVTransferParams map[string]json.RawMessage `json:"kv_transfer_params"`
}

func postPD(t *testing.T, s *Server, body map[string]any) (int, pdResponse, []byte) {
	t.Helper()
	code, b, _ := post(t, s.URL()+"/v1/completions", body)
	var r pdResponse
	if code == http.StatusOK {
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
	}
	return code, r, b
}

// prefillLeg is the request a P/D router sends to the prefill engine (the
// spec: stream false, max_tokens 1, do_remote_decode and nulls).
func prefillLeg(prompt []uint32) map[string]any {
	return map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false,
			"remote_engine_id": nil, "remote_block_ids": nil, "remote_host": nil, "remote_port": nil}}
}

func decodeLeg(prompt []uint32, kv any, maxTokens int) map[string]any {
	return map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true,
		"return_token_ids": true, "kv_transfer_params": kv}
}

func TestPDNixlPrefillLegAnswersVLLMFields(t *testing.T) {
	p := startSim(t, nixlConfig)
	prompt := tokens(1, 203) // 51 blocks of 4, the last partial
	code, r, raw := postPD(t, p, prefillLeg(prompt))
	if code != http.StatusOK {
		t.Fatalf("prefill leg: %d %s", code, raw)
	}
	keys := make([]string, 0, len(r.KVTransferParams))
	for k := range r.KVTransferParams {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	want := []string{"do_remote_decode", "do_remote_prefill", "remote_block_ids", "remote_engine_id", "remote_host", "remote_port", "remote_request_id", "tp_size"}
	if !slices.Equal(keys, want) {
		t.Fatalf("kv_transfer_params keys %v, want %v", keys, want)
	}
	var kv struct {
		DoRemotePrefill bool   `json:"do_remote_prefill"`
		DoRemoteDecode  bool   `json:"do_remote_decode"`
		BlockIDs        []int  `json:"remote_block_ids"`
		EngineID        string `json:"remote_engine_id"`
		RequestID       string `json:"remote_request_id"`
		Host            string `json:"remote_host"`
		Port            int    `json:"remote_port"`
		TPSize          int    `json:"tp_size"`
	}
	b, _ := json.Marshal(r.KVTransferParams)
	if err := json.Unmarshal(b, &kv); err != nil {
		t.Fatal(err)
	}
	_, portStr, _ := net.SplitHostPort(p.SideChannelAddr(0))
	port, _ := strconv.Atoi(portStr)
	if !kv.DoRemotePrefill || kv.DoRemoteDecode || len(kv.BlockIDs) != 51 || kv.EngineID != p.EngineID(0) || kv.EngineID == "" ||
		kv.RequestID == "" || kv.Host != "127.0.0.1" || kv.Port != port || kv.TPSize != 1 {
		t.Fatalf("kv_transfer_params %+v (side channel %s, engine %s)", kv, p.SideChannelAddr(0), p.EngineID(0))
	}
	if r.Choices[0].FinishReason == nil || *r.Choices[0].FinishReason != "length" || r.Usage.CompletionTokens != 1 {
		t.Fatalf("prefill leg answer %s", raw)
	}
	if l := p.Load(0); l.HeldBlocks != 51 || l.UsedBlocks != 51 || l.HeldRequests != 1 {
		t.Fatalf("prefill engine after the leg: %+v", l)
	}
	// An engine without --kv-transfer-config ignores the parameters (vLLM).
	if code, r0, raw := postPD(t, startSim(t, nil), prefillLeg(prompt)); code != 200 || r0.KVTransferParams != nil {
		t.Fatalf("engine without a connector: %d %s", code, raw)
	}
	// An ordinary request on the same engine carries no kv_transfer_params
	// and holds nothing.
	code, r2, raw := postPD(t, p, map[string]any{"model": "test-model", "prompt": tokens(5000, 20), "max_tokens": 2})
	if code != 200 || r2.KVTransferParams != nil || p.Load(0).HeldRequests != 1 {
		t.Fatalf("aggregated request: %d %s", code, raw)
	}
	// A prefill leg that stops before max_tokens holds nothing (vLLM:
	// only length-capped requests keep their blocks).
	ps := startSim(t, func(c *Config) { nixlConfig(c); c.EOSRate = 0.9 })
	leg := prefillLeg(tokens(1, 50))
	leg["max_tokens"] = 50
	code, r3, raw := postPD(t, ps, leg)
	if code != 200 || r3.KVTransferParams != nil || ps.Load(0).HeldRequests != 0 || *r3.Choices[0].FinishReason != "stop" {
		t.Fatalf("early-stopped prefill leg: %d %s held %d", code, raw, ps.Load(0).HeldRequests)
	}
}

func TestPDNixlDecodeReadsBlocksAndPrefillFreesThem(t *testing.T) {
	p := startSim(t, nixlConfig)
	d := startSim(t, nixlConfig)
	dEvents := newEventClient(t, d, 0)
	prompt := tokens(1, 203)

	// What an aggregated engine answers, for comparison.
	agg := startSim(t, nil)
	want := complete(t, agg, prompt, 8, "X-Request-Id", "agg")

	code, pr, raw := postPD(t, p, prefillLeg(prompt))
	if code != 200 {
		t.Fatalf("prefill leg: %d %s", code, raw)
	}
	code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 8))
	if code != 200 {
		t.Fatalf("decode leg: %d %s", code, raw)
	}
	if dr.KVTransferParams != nil {
		t.Fatalf("decode answer carries kv_transfer_params: %s", raw)
	}
	if got := dr.Usage.PromptTokensDetails.CachedTokens; got != len(prompt)-1 {
		t.Fatalf("decode cached_tokens %d, want %d (all but the last prompt token transferred)", got, len(prompt)-1)
	}
	if dr.Choices[0].Text != want.Choices[0].Text || dr.Usage.CompletionTokens != 8 {
		t.Fatalf("decode output %q, aggregated %q", dr.Choices[0].Text, want.Choices[0].Text)
	}
	// The prefill engine frees the blocks once the decode has read them.
	testutil.WaitFor(t, waitLong, "prefill engine to free the read blocks", func() bool {
		l := p.Load(0)
		return l.HeldBlocks == 0 && l.UsedBlocks == 0 && p.HeldRequests(0) == 0
	})
	pm, dm := scrape(t, p), scrape(t, d)
	e := "{engine=0}"
	for name, v := range map[string]float64{"vllm:kv_cache_usage_perc" + e: 0, "kvmesh_sim_pd_held_blocks" + e: 0,
		"kvmesh_sim_pd_held_requests" + e: 0, "kvmesh_sim_pd_transfers_total": 1, "vllm:nixl_num_kv_expired_reqs_total" + e: 0} {
		if pm[name] != v {
			t.Errorf("prefill %s = %v, want %v", name, pm[name], v)
		}
	}
	for name, v := range map[string]float64{"vllm:nixl_xfer_time_seconds" + e + "_count": 1, "vllm:nixl_bytes_transferred" + e + "_count": 1,
		"kvmesh_sim_pd_transfers_total": 1, "vllm:external_prefix_cache_hits_total" + e: float64(len(prompt) - 1),
		"vllm:prefix_cache_hits_total" + e: 0} {
		if dm[name] != v {
			t.Errorf("decode %s = %v, want %v", name, dm[name], v)
		}
	}
	if got := sourceCounts(t, d); got["external_kv_transfer"] != float64(len(prompt)-1) || got["local_compute"] != 1 || got["local_cache_hit"] != 0 {
		t.Errorf("decode prompt tokens by source %v", got)
	}
	if dm["vllm:nixl_xfer_time_seconds"+e+"_sum"] <= 0 || dm["vllm:nixl_bytes_transferred"+e+"_sum"] != 51*4*16384 {
		t.Errorf("transfer observed %v s, %v bytes", dm["vllm:nixl_xfer_time_seconds"+e+"_sum"], dm["vllm:nixl_bytes_transferred"+e+"_sum"])
	}
	// The decode engine stored the transferred blocks with BlockStored
	// events carrying the prompt's tokens, like a local prefill.
	var stored []uint32
	dEvents.poll(waitLong, func() bool {
		stored = stored[:0]
		for _, ev := range dEvents.events() {
			if ev.Kind == kvevents.BlockStored && ev.Medium == "GPU" {
				stored = append(stored, ev.TokenIDs...)
			}
		}
		return len(stored) >= 200
	})
	if !slices.Equal(stored[:200], prompt[:200]) {
		t.Fatalf("BlockStored tokens do not match the prompt: %v…", stored[:8])
	}
	if keys := d.CachedKeys(0, kvevents.TierGPU); len(keys) < 50 {
		t.Fatalf("decode engine caches %d blocks", len(keys))
	}
	// Presenting the same parameters again: already read, so the decode
	// prefills locally (its own cache now hits, but nothing is transferred).
	code, again, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 2))
	if code != 200 || again.Usage.PromptTokensDetails.CachedTokens != 200 {
		t.Fatalf("second read: %d %s", code, raw)
	}
	if dm2 := scrape(t, d); dm2["vllm:nixl_num_failed_transfers_total"+e] != 1 {
		t.Errorf("failed transfers %v, want 1", dm2["vllm:nixl_num_failed_transfers_total"+e])
	}
}

// A decode whose own cache already holds a prefix reads only the rest
// (vLLM reads only the blocks it has to allocate), yet frees all of the
// prefill's blocks.
func TestPDNixlDecodeReadsOnlyMissingBlocks(t *testing.T) {
	p := startSim(t, nixlConfig)
	d := startSim(t, nixlConfig)
	prompt := tokens(1, 120)
	complete(t, d, prompt[:80], 1) // 20 blocks cached on the decode engine
	_, pr, _ := postPD(t, p, prefillLeg(prompt))
	code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 2))
	if code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != 119 {
		t.Fatalf("decode leg: %d %s", code, raw)
	}
	testutil.WaitFor(t, waitLong, "prefill blocks freed", func() bool { return p.Load(0).HeldBlocks == 0 })
	dm := scrape(t, d)
	if got := dm["vllm:nixl_bytes_transferred{engine=0}_sum"]; got != 10*4*16384 { // 30 blocks − 20 local
		t.Fatalf("bytes transferred %v, want %v", got, 10*4*16384)
	}
	if got := dm["vllm:prefix_cache_hits_total{engine=0}"]; got != 80 { // first request: no hits; decode leg: its 20 local blocks
		t.Fatalf("local prefix hits %v", got)
	}
}

// TestPDNixlDecodeOverContextReadsNothing: a decode leg over the engine's
// max_model_len (prompt plus max_tokens) is refused (400) before its KV
// read, as vLLM's API server refuses it before the scheduler, where the
// NIXL read happens: the prefill engine still holds the blocks, and a decode
// leg within the context reads them. The read used to come first, which
// freed the prefill's hold and hid from the router's tests that on vLLM the
// blocks stay held until the abort timeout.
func TestPDNixlDecodeOverContextReadsNothing(t *testing.T) {
	p := startSim(t, nixlConfig)
	d := startSim(t, nixlConfig)
	prompt := tokens(1, 60)
	code, pr, raw := postPD(t, p, prefillLeg(prompt))
	if code != 200 || pr.KVTransferParams == nil {
		t.Fatalf("prefill leg: %d %s", code, raw)
	}
	code, _, raw = postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, d.cfg.Engine.MaxModelLen))
	if code != http.StatusBadRequest || !strings.Contains(string(raw), "maximum context length") {
		t.Fatalf("decode leg over the context: %d %s", code, raw)
	}
	if got := scrape(t, d)["vllm:nixl_num_failed_transfers_total{engine=0}"]; got != 0 {
		t.Fatalf("failed transfers %v, want 0 (no read)", got)
	}
	if p.HeldRequests(0) != 1 {
		t.Fatal("a refused decode leg freed the prefill's blocks")
	}
	code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 2))
	if code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != len(prompt)-1 {
		t.Fatalf("decode leg within the context: %d %s; want the held KV read (%d cached tokens)", code, raw, len(prompt)-1)
	}
}

func TestPDNixlInvalidParamsPrefillLocally(t *testing.T) {
	var logs testutil.SyncBuffer
	p := startSim(t, nixlConfig)
	d := startSim(t, func(c *Config) {
		nixlConfig(c)
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	prompt := tokens(1, 60)
	_, pr, _ := postPD(t, p, prefillLeg(prompt))
	for _, missing := range []string{"remote_block_ids", "remote_engine_id", "remote_request_id", "remote_host", "remote_port"} {
		kv := map[string]json.RawMessage{}
		for k, v := range pr.KVTransferParams {
			if k != missing {
				kv[k] = v
			}
		}
		code, dr, raw := postPD(t, d, decodeLeg(prompt, kv, 2))
		if code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != 0 && missing == "remote_block_ids" {
			t.Fatalf("without %s: %d %s", missing, code, raw)
		}
		if dr.Usage.CompletionTokens != 2 {
			t.Fatalf("without %s: %s", missing, raw)
		}
	}
	if code, _, raw := postPD(t, d, decodeLeg(prompt, map[string]any{"do_remote_prefill": "yes"}, 2)); code != http.StatusBadRequest {
		t.Fatalf("mistyped kv_transfer_params: %d %s", code, raw)
	}
	if !strings.Contains(logs.String(), "Got invalid KVTransferParams") {
		t.Fatalf("no vLLM-style warning in the log:\n%s", logs.String())
	}
	if got := scrape(t, d)["kvmesh_sim_pd_invalid_params_total{engine=0}"]; got != 5 {
		t.Fatalf("invalid params counted %v, want 5", got)
	}
	// Nothing was read, so the prefill engine still holds the blocks.
	if p.Load(0).HeldRequests != 1 {
		t.Fatal("an invalid read freed the prefill's blocks")
	}
	// A well-formed read of a request the prefill never held, or at the
	// wrong engine id, fails on the side channel: local prefill too.
	bad := map[string]any{"do_remote_prefill": true, "do_remote_decode": false, "remote_block_ids": []int{0, 1},
		"remote_engine_id": p.EngineID(0), "remote_request_id": "nope", "remote_host": "127.0.0.1",
		"remote_port": pr.KVTransferParams["remote_port"], "tp_size": 1}
	if code, dr, raw := postPD(t, d, decodeLeg(prompt, bad, 2)); code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != 56 {
		t.Fatalf("unknown request id: %d %s", code, raw) // 56: the decode's own cache from the loop above
	}
	bad["remote_engine_id"] = "someone-else"
	bad["remote_request_id"] = pr.KVTransferParams["remote_request_id"]
	if code, _, raw := postPD(t, d, decodeLeg(prompt, bad, 2)); code != 200 {
		t.Fatalf("wrong engine id: %d %s", code, raw)
	}
	if got := scrape(t, d)["vllm:nixl_num_failed_transfers_total{engine=0}"]; got != 2 {
		t.Fatalf("failed transfers %v, want 2", got)
	}
	if p.Load(0).HeldRequests != 1 {
		t.Fatal("a refused read freed the prefill's blocks")
	}
}

func TestPDNixlAbortTimeoutFreesUnreadBlocks(t *testing.T) {
	p := startSim(t, func(c *Config) { nixlConfig(c); c.PD.AbortTimeout = time.Second })
	d := startSim(t, nixlConfig)
	prompt := tokens(1, 80)
	_, pr, _ := postPD(t, p, prefillLeg(prompt))
	if pr.KVTransferParams == nil {
		t.Fatal("the prefill leg held nothing")
	}
	testutil.WaitFor(t, waitLong, "expiry to free the unread blocks", func() bool {
		return p.Load(0).HeldBlocks == 0 && p.HeldRequests(0) == 0
	})
	if got := scrape(t, p)["vllm:nixl_num_kv_expired_reqs_total{engine=0}"]; got != 1 {
		t.Fatalf("expired requests %v, want 1", got)
	}
	// The expired parameters no longer read anything: local prefill.
	code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 2))
	if code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("expired read: %d %s", code, raw)
	}
}

func TestPDSGLangBothLegsAtOnce(t *testing.T) {
	p := startSim(t, func(c *Config) { c.PD.DisaggregationMode = "prefill" })
	d := startSim(t, func(c *Config) { c.PD.DisaggregationMode = "decode" })
	impatient := startSim(t, func(c *Config) { c.PD.DisaggregationMode = "decode"; c.PD.BootstrapTimeout = 300 * time.Millisecond })
	host, portStr, _ := net.SplitHostPort(p.BootstrapAddr())
	port, _ := strconv.Atoi(portStr)
	prompt := tokens(7, 150)
	room := uint64(1<<63 + 12345)
	body := func(maxTokens int) map[string]any {
		return map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true,
			"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": room}
	}
	var wg sync.WaitGroup
	var dCode int
	var dr pdResponse
	var dRaw []byte
	wg.Add(1)
	go func() { // the decode leg first: it waits for the room
		defer wg.Done()
		code, b, _ := post(t, d.URL()+"/v1/completions", body(6))
		dCode, dRaw = code, b
		_ = json.Unmarshal(b, &dr)
	}()
	// The decode waits for the room in its waiting queue, as vLLM and
	// SGLang count it, before the prefill leg is even sent.
	testutil.WaitFor(t, waitLong, "the decode leg to wait for its room", func() bool {
		m := scrape(t, d)
		return m["vllm:num_requests_waiting{engine=0}"] == 1 && m["sglang:num_decode_transfer_queue_reqs"] == 1
	})
	pCode, pr, pRaw := postPD(t, p, body(6))
	wg.Wait()
	if pCode != 200 || pr.Usage.CompletionTokens != 1 {
		t.Fatalf("prefill leg: %d %s", pCode, pRaw)
	}
	if dCode != 200 || dr.Usage.CompletionTokens != 6 || dr.Usage.PromptTokensDetails.CachedTokens != len(prompt)-1 {
		t.Fatalf("decode leg: %d %s", dCode, dRaw)
	}
	testutil.WaitFor(t, waitLong, "prefill engine to free the room's blocks", func() bool {
		return p.Load(0).HeldBlocks == 0 && p.HeldRequests(0) == 0
	})
	if pm, dm := scrape(t, p), scrape(t, d); pm["type:sglang:num_prefill_inflight_queue_reqs"] != 1 ||
		pm["sglang:num_prefill_inflight_queue_reqs"] != 0 || dm["type:sglang:num_decode_transfer_queue_reqs"] != 1 {
		t.Fatalf("SGLang P/D queue gauges missing: prefill %v, decode %v", pm["type:sglang:num_prefill_inflight_queue_reqs"], dm["type:sglang:num_decode_transfer_queue_reqs"])
	}
	// A room whose prefill never comes: the decode gives up after its
	// timeout with an OpenAI error (SGLang aborts the request).
	b := body(3)
	b["bootstrap_room"] = 42
	code, raw, _ := post(t, impatient.URL()+"/v1/completions", b)
	var oe struct {
		Error struct {
			Message string `json:"message"`
			Code    int    `json:"code"`
		} `json:"error"`
	}
	if code != http.StatusInternalServerError || json.Unmarshal(raw, &oe) != nil || !strings.Contains(oe.Error.Message, "bootstrap_room 42") {
		t.Fatalf("room without prefill: %d %s", code, raw)
	}
}

// TestPDBracketedIPv6Hosts: a decode leg whose remote_host (NIXL) or
// bootstrap_host (SGLang) is an IPv6 address in brackets, "[::1]", reads
// the KV as from "::1": it dialled [[::1]]:port, failed and prefilled
// locally (tester h-ipv6 U3).
func TestPDBracketedIPv6Hosts(t *testing.T) {
	if ln, err := net.Listen("tcp", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	} else {
		_ = ln.Close()
	}
	v6 := func(c *Config) { nixlConfig(c); c.PD.SideChannelHost = "::1" }
	p, d := startSim(t, v6), startSim(t, v6)
	prompt := tokens(3, 83)
	code, pr, raw := postPD(t, p, prefillLeg(prompt))
	if code != 200 || string(pr.KVTransferParams["remote_host"]) != `"::1"` {
		t.Fatalf("prefill leg: %d %s", code, raw)
	}
	pr.KVTransferParams["remote_host"] = json.RawMessage(`"[::1]"`)
	code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 2))
	if code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != len(prompt)-1 {
		t.Errorf("NIXL decode leg with remote_host [::1]: %d %s; want %d cached tokens", code, raw, len(prompt)-1)
	}

	sp := startSim(t, func(c *Config) { c.PD.DisaggregationMode = "prefill"; c.PD.BootstrapAddr = "[::1]:0" })
	sd := startSim(t, func(c *Config) { c.PD.DisaggregationMode = "decode" })
	_, portStr, _ := net.SplitHostPort(sp.BootstrapAddr())
	port, _ := strconv.Atoi(portStr)
	body := map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 2, "ignore_eos": true,
		"bootstrap_host": "[::1]", "bootstrap_port": port, "bootstrap_room": 7}
	if code, _, raw := postPD(t, sp, body); code != 200 {
		t.Fatalf("SGLang prefill leg: %d %s", code, raw)
	}
	code, dr, raw = postPD(t, sd, body)
	if code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != len(prompt)-1 {
		t.Fatalf("SGLang decode leg with bootstrap_host [::1]: %d %s; want %d cached tokens", code, raw, len(prompt)-1)
	}
}

func TestPDConfigValidation(t *testing.T) {
	for _, bad := range []string{
		`{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}`,
		`{"kv_connector":"NixlConnector","kv_role":"kv_both","bogus":1}`,
		`{"kv_connector":"NixlConnector","kv_role":"both"}`,
		`{"kv_connector":"NixlConnector"`,
		`{"kv_role":"kv_both"}`,
		`{"kv_connector":"NixlConnector","kv_role":"kv_both"}}`, // a stray close: dec.More alone let it through (tester h-fuzz F2)
		`{"kv_connector":"NixlConnector","kv_role":"kv_both"}]`,
	} {
		if _, err := ParseKVTransferConfig(bad); !errors.Is(err, ErrInvalidConfig) {
			t.Errorf("%s: err %v", bad, err)
		}
	}
	kc, err := ParseKVTransferConfig(`{"kv_connector":"NixlConnector","kv_role":"kv_both","engine_id":"e1","kv_connector_extra_config":{"backends":["UCX"]}}`)
	if err != nil || kc.EngineID != "e1" {
		t.Fatalf("valid config: %+v %v", kc, err)
	}
	_, err = Start(t.Context(), Config{Logger: quietLogger(), PD: PDConfig{
		KVTransfer: &KVTransferConfig{KVConnector: "P2pNcclConnector", KVRole: "kv_both"}, DisaggregationMode: "middle"}})
	if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "NixlConnector") || !strings.Contains(err.Error(), "middle") ||
		!strings.Contains(err.Error(), "exclusive") {
		t.Fatalf("start with a bad P/D config: %v", err)
	}
}

func TestPDInfoEndpoint(t *testing.T) {
	p := startSim(t, func(c *Config) { nixlConfig(c); c.DP = 2; c.PD.EngineID = "eng" })
	resp, err := http.Get(p.URL() + "/kvmesh/pd")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		Role  string `json:"role"`
		Ranks []struct {
			EngineID    string `json:"engine_id"`
			SideChannel string `json:"side_channel"`
		} `json:"ranks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil {
		t.Fatal(err)
	}
	if info.Role != "both" || len(info.Ranks) != 2 || info.Ranks[1].EngineID != "eng_dp1" || info.Ranks[1].SideChannel != p.SideChannelAddr(1) {
		t.Fatalf("pd info %+v", info)
	}
}

// The decode leg streams like an aggregated request (chat included), and a
// prefill engine that died after its leg costs the request nothing: the
// decode prefills locally.
func TestPDNixlDecodeStreamsAndSurvivesDeadPrefill(t *testing.T) {
	p := startSim(t, nixlConfig)
	d := startSim(t, nixlConfig)
	agg := startSim(t, nil)
	msgs := []map[string]any{{"role": "user", "content": strings.Repeat("a fairly long question ", 20)}}
	leg := map[string]any{"model": "test-model", "messages": msgs, "max_tokens": 1, "max_completion_tokens": 1, "stream": false,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "do_remote_prefill": false}}
	code, raw, _ := post(t, p.URL()+"/v1/chat/completions", leg)
	var pr struct {
		Object string                     `json:"object"`
		KV     map[string]json.RawMessage `json:"kv_transfer_params"`
	}
	if code != 200 || json.Unmarshal(raw, &pr) != nil || pr.KV == nil || pr.Object != openai.ObjectChat {
		t.Fatalf("chat prefill leg: %d %s", code, raw)
	}
	body := func(kv any) map[string]any {
		return map[string]any{"model": "test-model", "messages": msgs, "max_tokens": 12, "ignore_eos": true,
			"stream_options": map[string]any{"include_usage": true}, "kv_transfer_params": kv}
	}
	got := stream(t, d.URL()+"/v1/chat/completions", body(pr.KV))
	want := stream(t, agg.URL()+"/v1/chat/completions", body(nil))
	if got.text != want.text || got.finish != want.finish || !slices.Equal(got.roles, want.roles) ||
		got.usage.CompletionTokens != 12 || got.usage.PromptTokensDetails.CachedTokens != got.usage.PromptTokens-1 {
		t.Fatalf("P/D stream %+v, aggregated %+v", got, want)
	}
	testutil.WaitFor(t, waitLong, "prefill blocks freed", func() bool { return p.Load(0).HeldBlocks == 0 })

	// A second prefill leg, then the prefill engine dies before the read.
	code, raw, _ = post(t, p.URL()+"/v1/chat/completions", leg)
	if code != 200 || json.Unmarshal(raw, &pr) != nil {
		t.Fatalf("second prefill leg: %d %s", code, raw)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	msgs[0]["content"] = strings.Repeat("a fairly long question ", 20) // same prompt: the decode's own cache hits
	got = stream(t, d.URL()+"/v1/chat/completions", body(pr.KV))
	if got.usage == nil || got.usage.CompletionTokens != 12 || got.text != want.text {
		t.Fatalf("decode after the prefill died: %+v", got)
	}
	if n := scrape(t, d)["vllm:nixl_num_failed_transfers_total{engine=0}"]; n != 1 {
		t.Fatalf("failed transfers %v, want 1", n)
	}
}

// The command-line flags map onto Config.PD with vLLM's environment
// variables as defaults, the flags winning.
func TestPDFlagsAndEnvironment(t *testing.T) {
	t.Setenv("VLLM_NIXL_SIDE_CHANNEL_HOST", "10.0.0.7")
	t.Setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "5700")
	t.Setenv("VLLM_NIXL_ABORT_REQUEST_TIMEOUT", "2.5")
	build := func(args ...string) (Config, error) {
		o := DefaultOptions()
		fs := flag.NewFlagSet("sim", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.StringVar(&o.Config.HTTPAddr, "http", o.Config.HTTPAddr, "")
		o.BindPDFlags(fs)
		if err := fs.Parse(args); err != nil {
			return Config{}, err
		}
		return o.Build(quietLogger())
	}
	cfg, err := build("--kv-transfer-config", `{"kv_connector":"NixlConnector","kv_role":"kv_consumer"}`, "--kv-transfer-gbps", "400")
	if err != nil {
		t.Fatal(err)
	}
	pd := cfg.PD
	if pd.KVTransfer.KVRole != "kv_consumer" || pd.SideChannelHost != "10.0.0.7" || pd.SideChannelPort != 5700 ||
		pd.AbortTimeout != 2500*time.Millisecond || pd.TransferGbps != 400 {
		t.Fatalf("from the environment: %+v", pd)
	}
	cfg, err = build("--http", "0.0.0.0:9000", "--nixl-side-channel", "127.0.0.1:0", "--nixl-abort-timeout", "3s",
		"--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", "9998")
	if err != nil {
		t.Fatal(err)
	}
	pd = cfg.PD
	if pd.SideChannelHost != "127.0.0.1" || pd.SideChannelPort != 0 || pd.AbortTimeout != 3*time.Second ||
		pd.DisaggregationMode != "prefill" || pd.BootstrapAddr != "0.0.0.0:9998" || pd.KVTransfer != nil {
		t.Fatalf("from flags: %+v", pd)
	}
	t.Setenv("VLLM_NIXL_SIDE_CHANNEL_PORT", "many")
	if _, err := build(); !errors.Is(err, ErrConfig) {
		t.Fatalf("bad environment: %v", err)
	}
	if _, err := build("--kv-transfer-config", `{"kv_connector":"NixlConnector"}`); err == nil || !strings.Contains(err.Error(), "kv_role") {
		t.Fatalf("incomplete kv transfer config: %v", err)
	}
}

// Garbage on the side channel gets an ERROR frame and is counted; it never
// frees or reads anything.
func TestSideChannelRejectsGarbage(t *testing.T) {
	p := startSim(t, nixlConfig)
	_, pr, _ := postPD(t, p, prefillLeg(tokens(1, 40)))
	for i, junk := range [][]byte{
		{0, 0, 0, 3, 9, 1, 0},                        // unknown version
		{0x7f, 0xff, 0xff, 0xff, 1, 1},               // oversized length
		appendFrame(nil, frameDone, nil),             // DONE before READ
		appendFrame(nil, frameRead, []byte{1}),       // truncated READ body
		appendFrame(nil, frameWait, make([]byte, 9)), // WAIT on a NIXL side channel
	} {
		conn, err := net.DialTimeout("tcp", p.SideChannelAddr(0), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(waitLong))
		if _, err := conn.Write(junk); err != nil {
			t.Fatal(err)
		}
		typ, body, err := readFrame(bufio.NewReader(conn), nil)
		_ = conn.Close()
		if err != nil || typ != frameError {
			t.Fatalf("junk %d: reply %v %v", i, typ, err)
		}
		if em, err := decodeErrorMsg(body); err != nil || em.Code != xferErrProtocol {
			t.Fatalf("junk %d: error %+v %v", i, em, err)
		}
	}
	if got := scrape(t, p)["kvmesh_sim_side_channel_errors_total"]; got != 5 {
		t.Fatalf("protocol errors counted %v, want 5", got)
	}
	if p.HeldRequests(0) != 1 || pr.KVTransferParams == nil {
		t.Fatal("garbage changed the held blocks")
	}
}

// A connection that sends no frame is closed after the first-frame wait,
// so idle or half-open connections cannot hold the side channel's slots
// (each held one for the 30 s exchange deadline, and a thousand of them kept
// every real read out: tester h-pdload). A real read still works after.
func TestSideChannelClosesSilentConnections(t *testing.T) {
	p := startSim(t, nixlConfig)
	p.pd.firstFrame.Store(int64(50 * time.Millisecond))
	conn, err := net.DialTimeout("tcp", p.SideChannelAddr(0), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte{0, 0}); err != nil { // part of a frame header, then nothing
		t.Fatal(err)
	}
	_ = conn.SetReadDeadline(time.Now().Add(waitLong))
	if _, err := conn.Read(make([]byte, 1)); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("read on a silent connection: %v; want it closed by the sim", err)
	}
	d := startSim(t, nixlConfig)
	prompt := tokens(4, 90)
	_, pr, _ := postPD(t, p, prefillLeg(prompt))
	if code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 3)); code != 200 || dr.Usage.PromptTokensDetails.CachedTokens == 0 {
		t.Fatalf("decode leg after the silent connection: %d %s", code, raw)
	}
}

// With data parallelism each rank has its own side channel (port+r) and
// engine id; a prefill leg pinned to rank 1 is read from rank 1.
func TestPDNixlDataParallelRanks(t *testing.T) {
	p := startSim(t, func(c *Config) { nixlConfig(c); c.DP = 2 })
	d := startSim(t, nixlConfig)
	prompt := tokens(3, 90)
	code, raw, _ := post(t, p.URL()+"/v1/completions", prefillLeg(prompt), "X-data-parallel-rank", "1")
	var pr pdResponse
	if code != 200 || json.Unmarshal(raw, &pr) != nil {
		t.Fatalf("prefill leg: %d %s", code, raw)
	}
	var eng string
	_ = json.Unmarshal(pr.KVTransferParams["remote_engine_id"], &eng)
	if eng != p.EngineID(1) || !strings.HasSuffix(eng, "_dp1") || p.Load(1).HeldRequests != 1 || p.Load(0).HeldRequests != 0 {
		t.Fatalf("engine id %q, held %d/%d", eng, p.Load(0).HeldRequests, p.Load(1).HeldRequests)
	}
	if code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 3)); code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != 89 {
		t.Fatalf("decode leg: %d %s", code, raw)
	}
	testutil.WaitFor(t, waitLong, "rank 1 to free its blocks", func() bool { return p.Load(1).HeldBlocks == 0 })
}

// An engine restart loses the held blocks with the rest of the cache; a
// decode presenting the old parameters prefills locally.
func TestPDNixlRestartDropsHolds(t *testing.T) {
	p := startSim(t, nixlConfig)
	d := startSim(t, nixlConfig)
	prompt := tokens(1, 64)
	_, pr, _ := postPD(t, p, prefillLeg(prompt))
	if p.HeldRequests(0) != 1 {
		t.Fatal("nothing held")
	}
	if err := p.Restart(); err != nil {
		t.Fatal(err)
	}
	if p.HeldRequests(0) != 0 || p.Load(0).HeldBlocks != 0 || p.Load(0).UsedBlocks != 0 {
		t.Fatalf("after restart: %d holds, %+v", p.HeldRequests(0), p.Load(0))
	}
	if code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 2)); code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != 0 {
		t.Fatalf("decode after the prefill restarted: %d %s", code, raw)
	}
	// The restarted engine serves P/D again.
	_, pr, _ = postPD(t, p, prefillLeg(prompt))
	if code, dr, raw := postPD(t, d, decodeLeg(prompt, pr.KVTransferParams, 2)); code != 200 || dr.Usage.PromptTokensDetails.CachedTokens != 63 {
		t.Fatalf("decode after a new prefill leg: %d %s", code, raw)
	}
}

// sourceCounts reads vllm:prompt_tokens_by_source_total of rank 0 by source.
func sourceCounts(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	out := map[string]float64{}
	for _, line := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(line, "vllm:prompt_tokens_by_source_total{") || !strings.Contains(line, `engine="0"`) {
			continue
		}
		i := strings.Index(line, `source="`)
		src := line[i+8 : i+8+strings.IndexByte(line[i+8:], '"')]
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		out[src] = v
	}
	return out
}

// TestPDNixlReadCancelledMidTransferFreesBlocks: a decode request that ends
// while its KV is in flight still completes the read and tells the prefill
// engine (vLLM's NIXL notification reaches it even when the decode request
// is aborted), which frees the blocks then, not at its 480 s abort timeout.
func TestPDNixlReadCancelledMidTransferFreesBlocks(t *testing.T) {
	p := startSim(t, nixlConfig)
	// 20 blocks at 70 kbit/s: a few seconds of wall time in transfer.
	d := startSim(t, func(c *Config) { nixlConfig(c); c.PD.TransferGbps = 7e-5 })
	prompt := tokens(1, 80)
	_, pr, raw := postPD(t, p, prefillLeg(prompt))
	if pr.KVTransferParams == nil || p.HeldRequests(0) != 1 {
		t.Fatalf("the prefill leg held nothing: %s", raw)
	}
	cancel, done := postInBackground(t, d.URL()+"/v1/completions", decodeLeg(prompt, pr.KVTransferParams, 2))
	defer cancel()
	testutil.WaitFor(t, waitLong, "the decode engine's read posted", func() bool { return d.pd.posted.Load() == 1 })
	cancel()
	if err := <-done; err == nil {
		t.Fatal("the decode request ended before it was cancelled")
	}
	testutil.WaitFor(t, waitLong, "the prefill engine to free the read blocks", func() bool {
		return p.Load(0).HeldBlocks == 0 && p.HeldRequests(0) == 0
	})
	pm := scrape(t, p)
	if pm["vllm:nixl_num_kv_expired_reqs_total{engine=0}"] != 0 || pm["kvmesh_sim_pd_transfers_total"] != 1 {
		t.Fatalf("expired %v, transfers %v: want the read's completion to free the blocks", pm["vllm:nixl_num_kv_expired_reqs_total{engine=0}"], pm["kvmesh_sim_pd_transfers_total"])
	}
}

// TestPDMembersExactNames: a case-variant "KV_Transfer_Params" is not
// kv_transfer_params (vLLM reads the request's members by their exact
// names, as Python does), even when the lower-case key is nested elsewhere.
func TestPDMembersExactNames(t *testing.T) {
	p := startSim(t, nixlConfig)
	body := map[string]any{"model": "test-model", "prompt": tokens(1, 40), "max_tokens": 1,
		"KV_Transfer_Params": map[string]any{"do_remote_decode": true}, "metadata": map[string]any{"kv_transfer_params": 1}}
	code, r, raw := postPD(t, p, body)
	if code != http.StatusOK || r.KVTransferParams != nil || p.HeldRequests(0) != 0 {
		t.Fatalf("status %d, held %d: %s", code, p.HeldRequests(0), raw)
	}
	// A wrong type under the exact name is still a 400 naming the field.
	body = map[string]any{"model": "test-model", "prompt": tokens(1, 40), "max_tokens": 1,
		"kv_transfer_params": map[string]any{"do_remote_decode": true, "remote_port": "x"}}
	if code, _, raw := postPD(t, p, body); code != http.StatusBadRequest || !strings.Contains(string(raw), "kv_transfer_params.remote_port") {
		t.Fatalf("wrong type: status %d: %s", code, raw)
	}
}

// TestPDDecodeCancelledBeforeReplyEndsPromptly: a decode request that ends
// just as its KV read is armed (connected, before the request frame) ends
// then, not when the reply wait (30 s + the bootstrap timeout) runs out. The
// request's end cuts the wait with a deadline in the past, which the reply
// wait's deadline used to overwrite when it was set after the hook. The peer
// (a bootstrap server that never answers) holds the connection until the
// test ends.
func TestPDDecodeCancelledBeforeReplyEndsPromptly(t *testing.T) {
	d := startSim(t, func(c *Config) { c.PD.DisaggregationMode = "decode"; c.PD.BootstrapTimeout = time.Hour })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	t.Cleanup(func() { close(release); ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { <-release; c.Close() }()
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cut := make(chan struct{})
	var once sync.Once
	d.pd.onCut = func() { once.Do(func() { close(cut) }) }
	// The client leaves once the read is armed; the read goes on only after
	// the request's end has reached the hook that cuts it.
	d.pd.onArmed = func() { cancel(); <-cut }
	host, portStr, _ := net.SplitHostPort(ln.Addr().String())
	port, _ := strconv.Atoi(portStr)
	b, err := json.Marshal(map[string]any{"model": "test-model", "prompt": tokens(7, 150), "max_tokens": 3, "ignore_eos": true,
		"bootstrap_host": host, "bootstrap_port": port, "bootstrap_room": 7})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, d.URL()+"/v1/completions", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Fatal("the decode request ended before it was cancelled")
	}
	select {
	case <-cut:
	case <-time.After(waitLong):
		t.Fatal("the request's end never reached the read")
	}
	// The peer is still holding the connection: only the cut can end the read.
	testutil.WaitFor(t, waitLong, "the cancelled decode leg's read to end", func() bool {
		return d.pd.metrics.inflight.Load() == 0 && d.ranks[0].transferring.Load() == 0
	})
}

// pdInfoHeld is rank 0's held requests and blocks as GET /kvmesh/pd
// reports them.
func pdInfoHeld(t *testing.T, s *Server) (requests, blocks int) {
	t.Helper()
	resp, err := http.Get(s.URL() + "/kvmesh/pd")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var info struct {
		Ranks []struct {
			HeldRequests int `json:"held_requests"`
			HeldBlocks   int `json:"held_blocks"`
		} `json:"ranks"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&info); err != nil || len(info.Ranks) == 0 {
		t.Fatalf("/kvmesh/pd: %v %+v", err, info)
	}
	return info.Ranks[0].HeldRequests, info.Ranks[0].HeldBlocks
}

// TestPDLegFinishedAsItsClientLeftExpires: a prefill leg whose client
// leaves after the engine step that finished it but before the step's
// tokens are delivered (the driver sleeps the step's wall time in between:
// a wide window on a stopped or overloaded host) keeps its blocks held, as
// vLLM keeps a finished do_remote_decode request's, and registers the hold,
// so the abort timeout frees them and counts them expired; /kvmesh/pd and
// the metrics agree throughout. The hold used to be dropped with the call:
// the blocks stayed held for good (no read or expiry could find them), the
// metrics counted them and /kvmesh/pd did not, and /reset_prefix_cache
// answered 409 for ever. NIXL and SGLang bootstrap rooms alike. The
// sweeper's clock is the test's (sweepAt), the abort timeout an hour.
func TestPDLegFinishedAsItsClientLeftExpires(t *testing.T) {
	prompt := tokens(1, 80)
	for _, tc := range []struct {
		name string
		mod  func(*Config)
		body map[string]any
	}{
		{"nixl", nixlConfig, prefillLeg(prompt)},
		{"sglang", func(c *Config) { c.PD.DisaggregationMode = "prefill" },
			map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 4, "bootstrap_host": "127.0.0.1", "bootstrap_port": 1, "bootstrap_room": 77}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startSim(t, func(c *Config) { tc.mod(c); c.PD.AbortTimeout = time.Hour })
			rk := p.ranks[0]
			stepped, resume := make(chan struct{}), make(chan struct{})
			var once sync.Once
			rk.mu.Lock()
			rk.onStep = func(finished int) {
				if finished > 0 {
					once.Do(func() { close(stepped); <-resume })
				}
			}
			rk.mu.Unlock()
			var resumeOnce sync.Once
			let := func() { resumeOnce.Do(func() { close(resume) }) }
			t.Cleanup(let)

			cancel, done := postInBackground(t, p.URL()+"/v1/completions", tc.body)
			defer cancel()
			select {
			case <-stepped:
			case <-time.After(waitLong):
				t.Fatal("the prefill leg never finished")
			}
			// The leg is finished in the engine, its tokens not delivered:
			// the client leaves now.
			cancel()
			if err := <-done; err == nil {
				t.Fatal("the prefill leg answered before its step was delivered")
			}
			testutil.WaitFor(t, waitLong, "the handler to abort the call", func() bool {
				rk.mu.Lock()
				defer rk.mu.Unlock()
				return len(rk.calls) == 0
			})
			let()
			testutil.WaitFor(t, waitLong, "the step delivered", func() bool {
				rk.mu.Lock()
				defer rk.mu.Unlock()
				return len(rk.fin) == 0
			})
			held := p.Load(0).HeldBlocks
			if held == 0 || p.HeldRequests(0) != 1 {
				t.Fatalf("held blocks %d, registered holds %d: want the leg's blocks held under one hold", held, p.HeldRequests(0))
			}
			agree := func(when string) {
				t.Helper()
				m := scrape(t, p)
				reqs, blocks := pdInfoHeld(t, p)
				if float64(reqs) != m["kvmesh_sim_pd_held_requests{engine=0}"] || float64(blocks) != m["kvmesh_sim_pd_held_blocks{engine=0}"] {
					t.Fatalf("%s: /kvmesh/pd holds %d requests, %d blocks; metrics %v, %v", when, reqs, blocks,
						m["kvmesh_sim_pd_held_requests{engine=0}"], m["kvmesh_sim_pd_held_blocks{engine=0}"])
				}
			}
			agree("held")
			if code, _, _ := post(t, p.URL()+"/reset_prefix_cache", nil); code != http.StatusConflict {
				t.Fatalf("/reset_prefix_cache with blocks held: %d, want 409", code)
			}
			p.pd.sweepAt(time.Now().Add(time.Hour + time.Minute))
			if l := p.Load(0); l.HeldBlocks != 0 || l.HeldRequests != 0 || p.HeldRequests(0) != 0 {
				t.Fatalf("past the abort timeout: %d blocks, %d requests held (%d holds)", l.HeldBlocks, l.HeldRequests, p.HeldRequests(0))
			}
			if got := scrape(t, p)["vllm:nixl_num_kv_expired_reqs_total{engine=0}"]; got != 1 {
				t.Fatalf("expired requests %v, want 1", got)
			}
			agree("expired")
			if code, raw, _ := post(t, p.URL()+"/reset_prefix_cache", nil); code != http.StatusOK {
				t.Fatalf("/reset_prefix_cache after the expiry: %d %s", code, raw)
			}
		})
	}
}

// TestPDDecodeDoesNotWaitForTheACK: a decode request goes on as soon as its
// KV has arrived; DONE and the prefill engine's ACK are exchanged off the
// request path. The prefill engine here frees the blocks on DONE and then
// hangs (a process stopped just after handing over its blocks): the decode
// answers while the ACK is outstanding, and the missing ACK is counted
// once the prefill side closes the connection without it. The decode
// request used to wait for the ACK up to 30 s.
func TestPDDecodeDoesNotWaitForTheACK(t *testing.T) {
	p := startSim(t, nixlConfig)
	d := startSim(t, nixlConfig)
	entered, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	let := func() { once.Do(func() { close(release) }) }
	p.pd.onDone = func() bool { close(entered); <-release; return false }
	t.Cleanup(let) // before the servers' Close (cleanups run last first)
	prompt := tokens(1, 80)
	_, pr, raw := postPD(t, p, prefillLeg(prompt))
	if pr.KVTransferParams == nil {
		t.Fatalf("the prefill leg held nothing: %s", raw)
	}
	type answer struct {
		code int
		r    pdResponse
		raw  []byte
	}
	got := make(chan answer, 1)
	go func() {
		code, b, _ := post(t, d.URL()+"/v1/completions", decodeLeg(prompt, pr.KVTransferParams, 2))
		var r pdResponse
		_ = json.Unmarshal(b, &r)
		got <- answer{code, r, b}
	}()
	select {
	case <-entered:
	case <-time.After(waitLong):
		t.Fatal("the decode engine never sent DONE")
	}
	var a answer
	select {
	case a = <-got:
	case <-time.After(waitLong):
		t.Fatal("the decode request waits for the prefill engine's ACK")
	}
	if a.code != http.StatusOK || a.r.Usage.PromptTokensDetails.CachedTokens != len(prompt)-1 {
		t.Fatalf("decode: %d %s", a.code, a.raw)
	}
	if l := p.Load(0); l.HeldBlocks != 0 || p.HeldRequests(0) != 0 {
		t.Fatalf("DONE did not free the prefill engine's blocks: %d held", l.HeldBlocks)
	}
	if m := scrape(t, d); m["kvmesh_sim_pd_ack_missing_total{engine=0}"] != 0 || m["vllm:nixl_num_failed_transfers_total{engine=0}"] != 0 {
		t.Fatalf("with the ACK still awaited: missing %v, failed %v; want 0, 0", m["kvmesh_sim_pd_ack_missing_total{engine=0}"], m["vllm:nixl_num_failed_transfers_total{engine=0}"])
	}
	let() // the prefill side closes the connection without an ACK
	testutil.WaitFor(t, waitLong, "the missing ACK counted", func() bool {
		return scrape(t, d)["kvmesh_sim_pd_ack_missing_total{engine=0}"] == 1
	})
	if m := scrape(t, d); m["vllm:nixl_num_failed_transfers_total{engine=0}"] != 0 || m["kvmesh_sim_pd_transfers_total"] != 1 {
		t.Fatalf("failed %v, received %v: want the transfer counted as done", m["vllm:nixl_num_failed_transfers_total{engine=0}"], m["kvmesh_sim_pd_transfers_total"])
	}
}

// postInBackground posts body as JSON to url from a goroutine; done gets the
// client's error (nil once an answer came), cancel cuts the request.
func postInBackground(t *testing.T, url string, body any) (cancel context.CancelFunc, done <-chan error) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	ch := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		ch <- err
	}()
	return cancel, ch
}
