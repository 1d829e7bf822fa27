package loadgen

import (
	"context"
	"strings"
	"testing"
	"time"
)

// An event carrying reasoning or a tool call is output: it sets TTFT
// (before, only text did, and a request whose whole answer was reasoning
// or a tool call had TTFT 0). A completed stream with no output event is
// marked NoOutput.
func TestReadBodyOutputEvents(t *testing.T) {
	const done = "data: [DONE]\n\n"
	chat := func(delta string) string {
		return "data: {\"choices\":[{\"index\":0,\"delta\":" + delta + "}]}\n\n"
	}
	usage := "data: " + usage40 + "\n\n"
	for _, c := range []struct {
		name     string
		ep       Endpoint
		stream   bool
		body     string
		noOutput bool
	}{
		{"chat text", Chat, true, chat(`{"content":"a"}`) + usage + done, false},
		{"chat reasoning_content", Chat, true, chat(`{"role":"assistant","content":null}`) + chat(`{"reasoning_content":"hm"}`) + usage + done, false},
		{"chat reasoning", Chat, true, chat(`{"reasoning":"hm"}`) + usage + done, false},
		{"chat tool call", Chat, true, chat(`{"tool_calls":[{"index":0,"id":"c","type":"function","function":{"name":"f","arguments":""}}]}`) + usage + done, false},
		{"chat empty tool calls", Chat, true, chat(`{"tool_calls":[]}`) + usage + done, true},
		{"chat role only", Chat, true, chat(`{"role":"assistant","content":""}`) + usage + done, true},
		{"completions usage only", Completions, true, usage + done, true},
		{"completions empty text", Completions, true, "data: " + completionEvent("") + "\n\n" + usage + done, true},
		{"responses reasoning", Responses, true, "data: {\"type\":\"response.reasoning_text.delta\",\"delta\":\"hm\"}\n\n", false},
		{"responses function call", Responses, true, "data: {\"type\":\"response.function_call_arguments.delta\",\"delta\":\"{\"}\n\n", false},
		{"responses created only", Responses, true, "data: {\"type\":\"response.created\",\"response\":{}}\n\n", true},
		{"messages thinking", Messages, true, "data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"hm\"}}\n\n", false},
		{"messages tool use", Messages, true, "data: {\"type\":\"content_block_start\",\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\n", false},
		{"messages tool input", Messages, true, "data: {\"type\":\"content_block_delta\",\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\"}}\n\n", false},
		{"messages start only", Messages, true, "data: {\"type\":\"message_start\",\"message\":{\"content\":[]}}\n\n", true},
		{"non-streamed tool call", Chat, false, `{"choices":[{"message":{"content":null,"tool_calls":[{"id":"c"}]}}]}`, false},
	} {
		var res Result
		readBody(context.Background(), strings.NewReader(c.body), c.stream, c.ep, false, time.Now(), &res)
		if res.ErrKind != "" {
			t.Errorf("%s: %s: %s", c.name, res.ErrKind, res.ErrMsg)
			continue
		}
		if res.NoOutput != c.noOutput || (res.TTFT > 0) == c.noOutput || res.OutputTokens == 0 && !c.noOutput {
			t.Errorf("%s: NoOutput %v, TTFT %v, output tokens %d; want NoOutput %v", c.name, res.NoOutput, res.TTFT, res.OutputTokens, c.noOutput)
		}
	}
}

// Completed requests without an output event are left out of the TTFT
// distribution and counted (before: each added a TTFT of 0, and with most
// of them the TTFT p50 was 0).
func TestRunNoOutputLeftOutOfTTFT(t *testing.T) {
	withText := "data: " + completionEvent("a") + "\n\ndata: " + usage40 + "\n\ndata: [DONE]\n\n"
	without := "data: " + usage40 + "\n\ndata: [DONE]\n\n"
	srv := rawServer(t, func(n int) string {
		if n == 1 {
			return withText
		}
		return without
	})
	rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: -1, Concurrency: 1}, sharedPrefix(t, 1, 4))
	if err != nil || rep.Completed != 4 || rep.NoOutput != 3 {
		t.Fatalf("%v: completed %d, without output %d; want 4 and 3", err, rep.Completed, rep.NoOutput)
	}
	var first Result
	for _, r := range rep.Results {
		if !r.NoOutput {
			first = r
		}
	}
	if rep.TTFT.P50 != first.TTFT.Seconds() || rep.TTFT.Mean != first.TTFT.Seconds() || first.TTFT <= 0 {
		t.Fatalf("TTFT %+v, want the one request with output's %v", rep.TTFT, first.TTFT)
	}
	var sb strings.Builder
	rep.WriteText(&sb)
	if !strings.Contains(sb.String(), "(over 1: 3 completed without an output event are left out)") {
		t.Errorf("text report:\n%s", sb.String())
	}
	run := rep.Run(1, nil)
	for i, rec := range run.Records {
		if rec.TTFT <= 0 || rec.TTFT > rec.E2E {
			t.Errorf("record %d: TTFT %v, E2E %v", i, rec.TTFT, rec.E2E)
		}
	}
}
