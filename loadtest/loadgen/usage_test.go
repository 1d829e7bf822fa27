package loadgen

import (
	"context"
	"strings"
	"testing"
	"time"
)

// A usage block that cannot be right (more cached than prompt tokens, a
// negative count) fails its request with kind "usage", in every API's
// form, so no report shows a hit rate above 100 % (before: a server
// reporting 500 cached of 100 prompt tokens gave "hit rate 500.0%").
func TestReadBodyBadUsage(t *testing.T) {
	text := "data: " + completionEvent("a") + "\n\n"
	for _, c := range []struct {
		name string
		ep   Endpoint
		body string
		want string // "" or the message's start
	}{
		{"good", Completions, text + "data: " + usage40 + "\n\ndata: [DONE]\n\n", ""},
		{"all cached", Completions, text + `data: {"usage":{"prompt_tokens":40,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":40}}}` + "\n\ndata: [DONE]\n\n", ""},
		{"more cached than prompt", Completions, text + `data: {"usage":{"prompt_tokens":100,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":500}}}` + "\n\ndata: [DONE]\n\n", "usage has more cached tokens (500) than prompt tokens (100)"},
		{"negative prompt", Chat, text + `data: {"usage":{"prompt_tokens":-1,"completion_tokens":1}}` + "\n\ndata: [DONE]\n\n", "usage has a negative token count"},
		{"negative cached", Chat, text + `data: {"usage":{"prompt_tokens":4,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":-4}}}` + "\n\ndata: [DONE]\n\n", "usage has a negative token count"},
		{"negative completion", Completions, text + `data: {"usage":{"prompt_tokens":4,"completion_tokens":-2}}` + "\n\ndata: [DONE]\n\n", "usage has a negative token count"},
		{"responses", Responses, `data: {"type":"response.output_text.delta","delta":"a"}` + "\n\n" + `data: {"type":"response.completed","response":{"usage":{"input_tokens":4,"input_tokens_details":{"cached_tokens":8},"output_tokens":1}}}` + "\n\n", "usage has more cached tokens (8) than prompt tokens (4)"},
		{"messages", Messages, `data: {"type":"content_block_delta","delta":{"text":"a"}}` + "\n\n" + `data: {"type":"message_delta","usage":{"input_tokens":-9,"cache_read_input_tokens":4,"output_tokens":1}}` + "\n\n", "usage has"},
	} {
		var res Result
		readBody(context.Background(), strings.NewReader(c.body), true, c.ep, false, time.Now(), &res)
		if c.want == "" {
			if res.ErrKind != "" {
				t.Errorf("%s: %s: %s", c.name, res.ErrKind, res.ErrMsg)
			}
			continue
		}
		if res.ErrKind != KindUsage || !strings.HasPrefix(res.ErrMsg, c.want) {
			t.Errorf("%s: kind %q (%s), want %q (%s…)", c.name, res.ErrKind, res.ErrMsg, KindUsage, c.want)
		}
	}
}

func TestRunBadUsageIsAnError(t *testing.T) {
	srv := rawServer(t, func(int) string {
		return "data: " + completionEvent("a") + "\n\n" +
			`data: {"usage":{"prompt_tokens":100,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":500}}}` + "\n\ndata: [DONE]\n\n"
	})
	rep, err := Run(context.Background(), Config{URL: srv.URL, Model: "m", Rate: -1, Concurrency: 1}, sharedPrefix(t, 1, 2))
	if err != nil || rep.Errors[KindUsage] != 2 || rep.Completed != 0 || rep.PrefixHitRate > 1 {
		t.Fatalf("%v: errors %v, completed %d, hit rate %v", err, rep.Errors, rep.Completed, rep.PrefixHitRate)
	}
}
