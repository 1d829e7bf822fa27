package ingress

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/sim"
)

// TestChatRenderWithinTokenizeBudget: rendering a chat template spends the
// request's tokenize budget too. A request whose tools make the template
// work far longer than a 1 ms budget is routed as one this ingress cannot
// tokenize (unkeyed), counted as a budget stop and not as
// a render fallback; with the budget off the same request renders and is
// keyed. Before, rendering had no time bound: megabytes of tools cost
// seconds of CPU before the template's step limit ended it.
func TestChatRenderWithinTokenizeBudget(t *testing.T) {
	nt, _ := llama(t)
	// Some work per tool (a real template formats each one), little output.
	tpl, err := tokenizer.NewChatTemplate(`{% for t in tools %}{% for i in range(2000) %}{% endfor %}{% endfor %}`+
		`{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}<assistant>`, nil)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	b.WriteString(`{"model":"tpl","max_tokens":2,"messages":[{"role":"user","content":"Which of the tools answers questions about the weather?"}],"tools":[`)
	for i := range 200 { // 400,000 loop steps: tens of milliseconds at least
		if i > 0 {
			b.WriteString(",")
		}
		b.WriteString(`{"type":"function","function":{"name":"f` + strconv.Itoa(i) + `","parameters":{"type":"object"}}}`)
	}
	b.WriteString(`]}`)
	body := b.String()

	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for _, budget := range []time.Duration{time.Millisecond, 0} {
		sm, err := sim.Start(context.Background(), sim.Config{Model: "tpl", TimeScale: 500, Tokenizer: nt, Chat: sim.TemplateChat{T: tpl}, Logger: quiet})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sm.Close() })
		cfg := testConfig(StaticEngine{ID: "s", Model: "tpl", URL: sm.URL()})
		cfg.TokenizeBudget = budget
		tk, err := NewTokenizer(nt, tpl)
		if err != nil {
			t.Fatal(err)
		}
		s, spy := spiedIngress(t, cfg, Deps{Tokenizers: TokenizerMap{"tpl": tk}, Logger: quiet})
		st, _, rb := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", body)
		if st != http.StatusOK {
			t.Fatalf("budget %v: %d %s", budget, st, rb)
		}
		keys, stops, fallbacks := len(spy.last()), val(s.m.tokenizeStoppedBudget), val(s.m.renderFallbacks)
		if fallbacks != 0 {
			t.Errorf("budget %v: %v render fallbacks counted; the template is not at fault", budget, fallbacks)
		}
		if budget == 0 {
			if keys == 0 || stops != 0 {
				t.Errorf("budget off: %d keys, %v budget stops; want it rendered and keyed", keys, stops)
			}
			continue
		}
		if keys != 0 || stops != 1 {
			t.Errorf("budget %v: %d keys, %v budget stops; want it routed untokenized and one stop", budget, keys, stops)
		}
	}
}
