package ingress

import (
	"context"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestLocalKVTokensCountsASharedPrefixOnce (tester h-reg7 F1): requests in
// flight on an engine charge its KV (LocalKVTokens, what the P/D policy's
// KV wait reads) with the distinct blocks of their prompts, as the engine
// holds a prefix they share once, plus each one's prompt tail and expected
// output; their active set (LocalActiveTokens, the cost model's decode
// working set) stays prompt plus output each. Counting the prefix per
// request made a decode engine serving one prefix look full. When they end,
// nothing stays charged.
func TestLocalKVTokensCountsASharedPrefixOnce(t *testing.T) {
	fe := startFaultEngine(t, faultHangAlive)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.AdminListen = "127.0.0.1:0"
	cfg.AdminToken = "admin-secret"
	s := startIngress(t, cfg, Deps{})
	bs := cfg.BlockSize
	// Two prompts of 3 full blocks and 2 tokens: the first two blocks
	// shared, the third and the tail their own.
	prompt := func(own int) string {
		ids := make([]string, 3*bs+2)
		for i := range ids {
			ids[i] = strconv.Itoa(100 + i)
			if i >= 2*bs {
				ids[i] = strconv.Itoa(own + i)
			}
		}
		return strings.Join(ids, ",")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var wg sync.WaitGroup
	for _, own := range []int{5000, 9000} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			req, _ := http.NewRequestWithContext(ctx, "POST", "http://"+s.Addr()+"/v1/completions",
				strings.NewReader(`{"model":"m","prompt":[`+prompt(own)+`],"max_tokens":20}`))
			if resp, err := http.DefaultClient.Do(req); err == nil {
				resp.Body.Close()
			}
		}()
	}
	testutil.WaitFor(t, 10*time.Second, "both requests at the engine", func() bool { return fe.hits.Load() == 2 })
	st, body := getAuth(t, "http://"+s.AdminAddr()+"/debug/engines", "admin-secret")
	cancel()
	wg.Wait()
	if st != http.StatusOK {
		t.Fatalf("/debug/engines: %d %s", st, body)
	}
	var got []struct {
		ID                               string
		LocalActiveTokens, LocalKVTokens int
	}
	if err := json.Unmarshal([]byte(body), &got); err != nil || len(got) != 1 {
		t.Fatalf("%v: %s", err, body)
	}
	e := got[0]
	wantAct := 2 * (3*bs + 2 + 20)
	wantKV := (2+1+1)*bs + 2*(2+20) // the shared blocks once, each one's own block, tail and output
	if e.LocalActiveTokens != wantAct || e.LocalKVTokens != wantKV {
		t.Errorf("engine shown %+v, want LocalActiveTokens %d (prompt + output each) and LocalKVTokens %d (the shared prefix once)",
			e, wantAct, wantKV)
	}
	up := s.ups.lookup("e1")
	testutil.WaitFor(t, 10*time.Second, "the charges released", func() bool {
		up.kvMu.Lock()
		refs := len(up.kvRefs)
		up.kvMu.Unlock()
		return up.kvTokens() == 0 && refs == 0
	})
}
