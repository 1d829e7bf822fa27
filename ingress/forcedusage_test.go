package ingress

import (
	"bytes"
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
	// client as a chat chunk.
	se := startSSEEngine(t, stream, 50, 0)
	se.forced.Store(true)
	s := wrapIngress(t, se.url())
	for i := 0; i < 2; i++ {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"hi"}],"stream":true}`)
		evs := sseEvents(b)
		if st != 200 || len(evs) != 4 || !strings.Contains(evs[2], `"object":"chat.completion.chunk"`) || !strings.Contains(evs[2], `"completion_tokens":7`) {
			t.Fatalf("re-wrap, request %d: %d %q", i, st, evs)
		}
	}
}
