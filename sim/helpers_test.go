package sim

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sim/engine"
	zmq "github.com/pebbe/zmq4"
)

func quietLogger() *slog.Logger {
	return slog.New(slog.NewTextHandler(io.Discard, nil))
}

// startSim starts a simulator on loopback with events and replay, closed at
// the end of the test.
func startSim(t *testing.T, mod func(*Config)) *Server {
	t.Helper()
	cfg := Config{
		Model: "test-model", KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0",
		Engine:    engine.Config{BlockSize: 4, GPUBlocks: 256, Profile: mustProfile(t, "tiny")},
		TimeScale: 50, Seed: 7, Logger: quietLogger(),
		// A connection goroutine starved past the 10 s default on a loaded
		// machine would be closed without a reply.
		ReadHeaderTimeout: time.Minute,
	}
	if mod != nil {
		mod(&cfg)
	}
	s, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := s.Close(); err != nil {
			t.Errorf("close: %v", err)
		}
	})
	return s
}

func mustProfile(t *testing.T, name string) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func tokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// post sends a JSON body and returns the status and body.
func post(t *testing.T, url string, body any, hdr ...string) (int, []byte, http.Header) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(b))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, out, resp.Header
}

// complete runs a non-streaming completion with token ids and returns it.
func complete(t *testing.T, s *Server, prompt []uint32, maxTokens int, hdr ...string) openai.Completion {
	t.Helper()
	code, body, _ := post(t, s.URL()+"/v1/completions", map[string]any{
		"model": "test-model", "prompt": prompt, "max_tokens": maxTokens, "ignore_eos": true}, hdr...)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, body)
	}
	var c openai.Completion
	if err := json.Unmarshal(body, &c); err != nil {
		t.Fatal(err)
	}
	return c
}

// eventClient is an independent consumer of one rank's KV events written
// directly on ZMQ (SUB + DEALER), so the simulator is checked against the
// spec rather than against kvevents.Subscriber.
type eventClient struct {
	t        *testing.T
	sub      *zmq.Socket
	dealer   *zmq.Socket
	next     uint64            // next expected sequence number
	got      map[uint64][]byte // seq → payload
	order    []uint64          // seqs in delivery order (live and replayed)
	gaps     int               // gaps detected on the live socket
	live     int               // batches received live
	restarts int
	legacy   bool // replay replies without the topic frame (old vLLM, SGLang)
}

func newEventClient(t *testing.T, s *Server, rank int) *eventClient {
	t.Helper()
	sub, err := zmq.NewSocket(zmq.SUB)
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetLinger(0)
	if err := sub.SetSubscribe(""); err != nil {
		t.Fatal(err)
	}
	if err := sub.Connect(s.EventsEndpoint(rank)); err != nil {
		t.Fatal(err)
	}
	c := &eventClient{t: t, sub: sub, got: map[uint64][]byte{}}
	if ep := s.ReplayEndpoint(rank); ep != "" {
		d, err := zmq.NewSocket(zmq.DEALER)
		if err != nil {
			t.Fatal(err)
		}
		_ = d.SetLinger(0)
		if err := d.Connect(ep); err != nil {
			t.Fatal(err)
		}
		c.dealer = d
	}
	t.Cleanup(func() {
		_ = c.sub.Close()
		if c.dealer != nil {
			_ = c.dealer.Close()
		}
	})
	return c
}

// poll receives live messages until cond holds or the timeout passes. A
// sequence jump triggers a replay from the first missing number.
func (c *eventClient) poll(timeout time.Duration, cond func() bool) {
	c.t.Helper()
	deadline := time.Now().Add(timeout)
	poller := zmq.NewPoller()
	poller.Add(c.sub, zmq.POLLIN)
	for !cond() {
		if time.Now().After(deadline) {
			c.t.Fatalf("event client: timed out (next seq %d, %d batches)", c.next, len(c.got))
		}
		socks, err := poller.Poll(20 * time.Millisecond)
		if err != nil || len(socks) == 0 {
			if c.dealer != nil {
				c.replay(c.next) // quiet: catch up on batches sent before we joined
			}
			continue
		}
		frames, err := c.sub.RecvMessageBytes(0)
		if err != nil {
			c.t.Fatal(err)
		}
		if len(frames) != 3 || len(frames[1]) != 8 {
			c.t.Fatalf("live message with %d frames (want topic, seq8, payload)", len(frames))
		}
		seq := binary.BigEndian.Uint64(frames[1])
		c.live++
		switch {
		case seq < c.next && c.next > 0 && seq == 0:
			c.restarts++ // engine restart: start over
			c.next = 0
			c.got = map[uint64][]byte{}
		case seq > c.next:
			c.gaps++
			c.replay(c.next)
		}
		if seq >= c.next {
			c.accept(seq, frames[2])
		}
	}
}

func (c *eventClient) accept(seq uint64, payload []byte) {
	if _, dup := c.got[seq]; dup {
		return
	}
	c.got[seq] = bytes.Clone(payload)
	c.order = append(c.order, seq)
	for {
		if _, ok := c.got[c.next]; !ok {
			break
		}
		c.next++
	}
}

// replay asks the ROUTER for every batch from start and accepts the replies
// (new layout: "", topic, seq8, payload … end "", "", ff×8, "").
func (c *eventClient) replay(start uint64) {
	c.t.Helper()
	if c.dealer == nil {
		c.t.Fatal("gap without a replay socket")
	}
	var sb [8]byte
	binary.BigEndian.PutUint64(sb[:], start)
	if _, err := c.dealer.SendMessage("", sb[:]); err != nil {
		c.t.Fatal(err)
	}
	poller := zmq.NewPoller()
	poller.Add(c.dealer, zmq.POLLIN)
	for {
		socks, err := poller.Poll(2 * time.Second)
		if err != nil || len(socks) == 0 {
			c.t.Fatal("replay: no reply")
		}
		frames, err := c.dealer.RecvMessageBytes(0)
		if err != nil {
			c.t.Fatal(err)
		}
		if len(frames[len(frames)-1]) == 0 {
			return // end marker: the last frame is empty
		}
		if c.legacy {
			if len(frames) != 3 || len(frames[0]) != 0 || len(frames[1]) != 8 {
				c.t.Fatalf("legacy replay reply with %d frames", len(frames))
			}
			c.accept(binary.BigEndian.Uint64(frames[1]), frames[2])
			continue
		}
		if len(frames) != 4 || len(frames[0]) != 0 || len(frames[2]) != 8 {
			c.t.Fatalf("replay reply with %d frames", len(frames))
		}
		c.accept(binary.BigEndian.Uint64(frames[2]), frames[3])
	}
}

// events decodes every batch received so far, in sequence order.
func (c *eventClient) events() []kvevents.Event {
	c.t.Helper()
	var out []kvevents.Event
	for seq := uint64(0); seq < c.next; seq++ {
		var b kvevents.Batch
		if err := kvevents.DecodeBatch(c.got[seq], &b); err != nil {
			c.t.Fatalf("seq %d: %v", seq, err)
		}
		out = append(out, b.Events...)
	}
	return out
}

func (c *eventClient) String() string { return fmt.Sprintf("next=%d gaps=%d", c.next, c.gaps) }
