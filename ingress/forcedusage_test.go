package ingress

import (
	"bytes"
	"fmt"
	"net/http"
	"strings"
	"testing"
)

// vLLM run with --enable-force-include-usage sends the usage chunk to a
// client that did not ask for it; through the ingress that client gets it
// too. The model's first stream without stream_options is the probe that
// learns it (sent as the client wrote it); later ones carry the ingress's
// include_usage and pass the chunk on. Engines that send usage only when
// asked keep it from a client that did not ask, as before. Output tokens
// come from the usage whenever the engine sent one.
func TestForcedUsagePassesThrough(t *testing.T) {
	stream := completionEvent(0, "a", "") + completionEvent(1, "b", "length") +
		`data: {"id":"cmpl-f","object":"text_completion","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":2,"completion_tokens":7,"total_tokens":9}}` + "\n\n" +
		"data: [DONE]\n\n"
	noUsage := withoutUsage(stream)
	const req = `{"model":"m","prompt":[1,2],"stream":true}`
	for _, tc := range []struct {
		name      string
		forced    bool
		want      string
		tokensOut []float64 // after each of the two requests
	}{
		{"forced", true, stream, []float64{7, 14}},
		{"asked", false, noUsage, []float64{2, 9}}, // the probe counts its 2 events
	} {
		t.Run(tc.name, func(t *testing.T) {
			se := startSSEEngine(t, stream, 50, 0)
			se.forced.Store(tc.forced)
			s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: se.url()}), Deps{})
			for i, asked := range []bool{false, true} {
				st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", req)
				if st != 200 || string(b) != tc.want {
					t.Fatalf("request %d: status %d: got %q, want %q", i, st, b, tc.want)
				}
				if body := <-se.bodies; bytes.Contains(body, []byte(`"include_usage":true`)) != asked {
					t.Fatalf("request %d: the engine got %s (the ingress's include_usage: %v expected)", i, body, asked)
				}
				waitSettled(t, s)
				if got := val(s.m.tokensOut); got != tc.tokensOut[i] {
					t.Fatalf("request %d: %v output tokens counted, want %v", i, got, tc.tokensOut[i])
				}
			}
			// A client that sets stream_options gets what the engine sends
			// (vLLM forces usage over include_usage false too).
			_, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions",
				strings.TrimSuffix(req, "}")+`,"stream_options":{"include_usage":false}}`)
			if string(b) != tc.want {
				t.Fatalf("include_usage false: got %q, want %q", b, tc.want)
			}
		})
	}

	// Chat re-wrapped from completions: the forced usage chunk reaches the
	// client as a chat chunk (after the role chunk and the text's two).
	se := startSSEEngine(t, stream, 50, 0)
	se.forced.Store(true)
	s := wrapIngress(t, se.url())
	for i := 0; i < 2; i++ {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		evs := sseEvents(b)
		if st != 200 || len(evs) != 5 || !strings.Contains(evs[3], `"object":"chat.completion.chunk"`) || !strings.Contains(evs[3], `"completion_tokens":7`) {
			t.Fatalf("re-wrap, request %d: %d %q", i, st, evs)
		}
	}
}

// With stream_options continuous_usage_stats (vLLM) every chunk carries the
// usage of its own choice. Through the ingress the client gets every one
// of them; the ingress counts the request's output tokens from a chunk's
// usage only when the engine decodes one sequence, and from the final
// usage-only chunk otherwise (mid-stream, one token per event), so n > 1
// never reads one choice's count as the request's.
func TestContinuousUsageCounted(t *testing.T) {
	s := startIngress(t, testConfig(simEngines(startSims(t, 1, "m"), "m")...), Deps{})
	for _, n := range []int{1, 2} {
		body := fmt.Sprintf(`{"model":"m","prompt":"count these tokens","max_tokens":9,"ignore_eos":true,"n":%d,"stream":true,`+
			`"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`, n)
		before := val(s.m.tokensOut)
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		evs := sseEvents(b)
		if st != 200 || len(evs) < 3 || evs[len(evs)-1] != "[DONE]" {
			t.Fatalf("n %d: status %d: %q", n, st, evs)
		}
		for _, ev := range evs[:len(evs)-1] {
			if !strings.Contains(ev, `"completion_tokens":`) {
				t.Fatalf("n %d: a chunk without its usage: %s", n, ev)
			}
		}
		waitSettled(t, s)
		if got := val(s.m.tokensOut) - before; got != float64(9*n) {
			t.Errorf("n %d: %v output tokens counted, want %d", n, got, 9*n)
		}
	}

	// Mid-stream, two choices: events, not one choice's usage.
	ev := func(i, k int) string {
		return fmt.Sprintf(`data: {"choices":[{"index":%d,"text":"x","finish_reason":null}],"usage":{"prompt_tokens":3,"total_tokens":%d,"completion_tokens":%d}}`+"\n\n", i, 3+k, k)
	}
	for _, tc := range []struct {
		seqs, want int
	}{{1, 2}, {2, 4}} {
		p := &proxyStream{c: &call{seqs: tc.seqs}}
		p.observe([]byte(ev(0, 1) + ev(1, 1)))
		p.observe([]byte(ev(0, 2)))
		if tc.seqs == 2 {
			p.observe([]byte(ev(1, 2)))
		}
		if p.c.outTokens != tc.want {
			t.Errorf("%d sequences: %d output tokens mid-stream, want %d", tc.seqs, p.c.outTokens, tc.want)
		}
		p.observe([]byte(`data: {"choices":[],"usage":{"prompt_tokens":3,"total_tokens":7,"completion_tokens":4}}` + "\n\ndata: [DONE]\n\n"))
		if p.c.outTokens != 4 {
			t.Errorf("%d sequences: %d output tokens after the final usage, want 4", tc.seqs, p.c.outTokens)
		}
	}
}
