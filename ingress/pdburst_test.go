package ingress

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/scheduler"
)

// burstEngine is a fake P/D engine that reports each request's arrival
// (engine id, "prefill" or "request") and holds its answer until release
// closes, so that every earlier request is still in flight when the next
// one is routed.
func burstEngine(t *testing.T, id string, arrived chan<- string, release <-chan struct{}) string {
	t.Helper()
	f := &fakePDEngine{}
	f.params.Store("")
	f.prefillB.Store("")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		kind := "request"
		if bytes.Contains(body, []byte(`"do_remote_decode":true`)) {
			kind = "prefill"
		}
		if r.URL.Path == "/v1/completions" { // not the ingress's tokenizing calls (enginetok.go)
			arrived <- id + " " + kind
			<-release
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		f.serve(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestPDBurstSpreads: requests routed while the earlier ones are still in
// flight on an idle 2 prefill + 2 decode cluster spread over both pairs,
// for kvmesh-always and kvmesh. The decode engine of a request whose
// prefill leg runs is charged from the plan on (pdState.reserve): before,
// nothing counted it there until the leg answered, so every decode leg of
// a burst of long prompts went to the first decode engine (tester
// h-pdload: four streams p0 → d0 while p1 and d1 sat idle).
func TestPDBurstSpreads(t *testing.T) {
	const n = 4
	prompt := make([]string, 4000)
	for i := range prompt {
		prompt[i] = fmt.Sprint(1000 + i)
	}
	for _, policy := range []string{"kvmesh-always", "kvmesh"} {
		t.Run(policy, func(t *testing.T) {
			arrived := make(chan string, 4*n)
			release := make(chan struct{})
			released := false
			defer func() {
				if !released {
					close(release)
				}
			}()
			s := startPDIngress(t, policy, PDConfig{},
				pdEngine("p0", scheduler.RolePrefill, burstEngine(t, "p0", arrived, release)),
				pdEngine("p1", scheduler.RolePrefill, burstEngine(t, "p1", arrived, release)),
				pdEngine("d0", scheduler.RoleDecode, burstEngine(t, "d0", arrived, release)),
				pdEngine("d1", scheduler.RoleDecode, burstEngine(t, "d1", arrived, release)))
			type answer struct {
				engine string
				err    error
			}
			answers := make(chan answer, n)
			first := map[string]int{}
			for i := 0; i < n; i++ {
				// Distinct prompts: no request's prefix is cached by another's.
				body := fmt.Sprintf(`{"model":"m","prompt":[%d,%s],"max_tokens":64,"stream":true}`, i, strings.Join(prompt, ","))
				go func() {
					resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
					if err != nil {
						answers <- answer{err: err}
						return
					}
					defer resp.Body.Close()
					b, err := io.ReadAll(resp.Body)
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d: %s", resp.StatusCode, b)
					}
					answers <- answer{engine: resp.Header.Get("X-Kvmesh-Engine"), err: err}
				}()
				// Its first hop (a prefill leg, or the whole request on a
				// decode engine) is in flight before the next is sent.
				first[<-arrived]++
			}
			close(release)
			released = true
			decode := map[string]int{}
			for i := 0; i < n; i++ {
				a := <-answers
				if a.err != nil {
					t.Fatal(a.err)
				}
				decode[a.engine]++
			}
			t.Logf("first hops %v, answered by %v", first, decode)
			s.pd.mu.Lock()
			if len(s.pd.pending) != 0 {
				t.Errorf("reservations left after every request ended: %v", s.pd.pending)
			}
			s.pd.mu.Unlock()
			for hop, k := range first {
				if k > n/2 {
					t.Errorf("first hops %v: %d of %d requests on %s while the others idle", first, k, n, hop)
				}
			}
			for _, d := range []string{"d0", "d1"} {
				if decode[d] != n/2 {
					t.Errorf("answered by %v: want %d each on d0 and d1", decode, n/2)
					break
				}
			}
		})
	}
}

// holdTokenizer encodes a text as one token per byte; a text starting
// with "hold" waits, after it reported itself on held, until go closes.
type holdTokenizer struct {
	held chan<- struct{}
	goOn <-chan struct{}
}

func (h holdTokenizer) Encode(dst []uint32, text []byte) ([]uint32, error) {
	if bytes.HasPrefix(text, []byte("hold")) {
		h.held <- struct{}{}
		<-h.goOn
	}
	for _, b := range text {
		dst = append(dst, uint32(b))
	}
	return dst, nil
}

func (h holdTokenizer) RenderChat(dst []uint32, msgs []Message) ([]uint32, error) {
	return nil, fmt.Errorf("no chat")
}

// TestPDPlanSeesLegsSentMeanwhile: a request's P/D plan sees the legs
// sent while it was tokenized, not the cluster as it found it on
// arrival: B arrives, A arrives and its prefill leg goes to p0 while B
// is tokenized; B's plan takes p1 and d1 (pdLoad). Before, B's plan read
// the load of its arrival and went to p0 as A did (tester h-pdload:
// four simultaneous requests p0 → d0).
func TestPDPlanSeesLegsSentMeanwhile(t *testing.T) {
	arrived := make(chan string, 8)
	release := make(chan struct{})
	held, goOn := make(chan struct{}, 1), make(chan struct{})
	released := false
	defer func() {
		if !released {
			close(goOn)
			close(release)
		}
	}()
	c := testConfig()
	c.PD = PDConfig{}
	s := startIngress(t, c, Deps{PD: pdRouter(t, "kvmesh-always"), Tokenizers: TokenizerMap{"m": holdTokenizer{held: held, goOn: goOn}},
		Membership: roleMembership{
			pdEngine("p0", scheduler.RolePrefill, burstEngine(t, "p0", arrived, release)),
			pdEngine("p1", scheduler.RolePrefill, burstEngine(t, "p1", arrived, release)),
			pdEngine("d0", scheduler.RoleDecode, burstEngine(t, "d0", arrived, release)),
			pdEngine("d1", scheduler.RoleDecode, burstEngine(t, "d1", arrived, release))}})
	text := strings.Repeat("a long prompt ", 400)
	answers := make(chan string, 2)
	send := func(prompt string) {
		body := fmt.Sprintf(`{"model":"m","prompt":%q,"max_tokens":64,"stream":true}`, prompt)
		resp, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			answers <- err.Error()
			return
		}
		defer resp.Body.Close()
		io.Copy(io.Discard, resp.Body)
		answers <- fmt.Sprintf("%d %s", resp.StatusCode, resp.Header.Get("X-Kvmesh-Engine"))
	}
	go send("hold B " + text)
	<-held // B has its candidates and waits in its tokenizing
	go send("A " + text)
	a := <-arrived // A's prefill leg, in flight
	close(goOn)
	b := <-arrived // B's prefill leg
	close(release)
	released = true
	got := []string{<-answers, <-answers}
	if a == b || !strings.HasSuffix(a, " prefill") || !strings.HasSuffix(b, " prefill") {
		t.Errorf("prefill legs: A's %q, B's %q: want one on each prefill engine", a, b)
	}
	if got[0] == got[1] || !strings.HasPrefix(got[0], "200 d") || !strings.HasPrefix(got[1], "200 d") {
		t.Errorf("answers %q: want one from each decode engine", got)
	}
}

// TestPickReleasesPDReservation: the picker API plans but runs no legs, so a
// P/D plan's reservation made through it (a server embedding the picker with
// P/D on) is released at once, not left on its engines for good (review).
func TestPickReleasesPDReservation(t *testing.T) {
	p, d := startFakePD(t, false), startFakePD(t, false)
	s := startPDIngress(t, "kvmesh-always", PDConfig{},
		pdEngine("p0", scheduler.RolePrefill, p.url()), pdEngine("d0", scheduler.RoleDecode, d.url()))
	pk, err := s.Pick(PickInput{Body: []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":2}`)})
	if err != nil {
		t.Fatal(err)
	}
	pk.Done(200)
	ps := s.pdInit()
	ps.mu.Lock()
	left := len(ps.pending)
	ps.mu.Unlock()
	if left != 0 {
		t.Fatalf("%d engines still reserved after a pick", left)
	}
}
