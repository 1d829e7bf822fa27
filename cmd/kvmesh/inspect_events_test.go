package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	"github.com/kvmesh/kvmesh/kvevents"
)

func fixturePath(name string) string { return filepath.Join("..", "..", "testdata", "kvevents", name) }

func decodeJSON(t *testing.T, line string) map[string]any {
	t.Helper()
	d := json.NewDecoder(strings.NewReader(line))
	d.UseNumber()
	var m map[string]any
	if err := d.Decode(&m); err != nil {
		t.Fatalf("output %q is not JSON: %v", line, err)
	}
	return m
}

func TestInspectEventsFile(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"inspect", "events", "--file", fixturePath("vllm_batch_array_form.msgpack")}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	if strings.Count(out.String(), "\n") != 1 {
		t.Fatalf("want one JSON object on one line, got %q", out.String())
	}
	m := decodeJSON(t, out.String())
	if m["ts"].(json.Number).String() != "1757500000.25" || m["data_parallel_rank"].(json.Number).String() != "0" {
		t.Fatalf("envelope %v", m)
	}
	events := m["events"].([]any)
	stored := events[0].(map[string]any)
	hashes := stored["block_hashes"].([]any)
	// Unsigned decimal, not float or negative.
	if stored["type"] != "BlockStored" || hashes[0].(json.Number).String() != "3236607068019569386" ||
		hashes[1].(json.Number).String() != "2758186210834249151" || stored["parent_block_hash"] != nil ||
		stored["block_size"].(json.Number).String() != "16" || stored["medium"] != "GPU" || len(stored["token_ids"].([]any)) != 32 {
		t.Fatalf("BlockStored %v", stored)
	}
	if _, ok := stored["parent_block_hash"]; !ok {
		t.Fatal("parent_block_hash must be present (null)")
	}
	if events[1].(map[string]any)["type"] != "BlockRemoved" || events[2].(map[string]any)["type"] != "AllBlocksCleared" || len(events[2].(map[string]any)) != 1 {
		t.Fatalf("events %v", events)
	}

	out.Reset()
	if code := run([]string{"inspect", "events", "--file", fixturePath("vllm_batch_map_form.msgpack")}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	removed := decodeJSON(t, out.String())["events"].([]any)[1].(map[string]any)
	if removed["group_idx"].(json.Number).String() != "0" || removed["medium"] != "GPU" {
		t.Fatalf("BlockRemoved %v", removed)
	}

	out.Reset()
	if code := run([]string{"inspect", "events", "--file", fixturePath("vllm_batch_bytes_hash_dp1.msgpack")}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	m = decodeJSON(t, out.String())
	if m["data_parallel_rank"].(json.Number).String() != "1" ||
		m["events"].([]any)[0].(map[string]any)["block_hashes"].([]any)[0].(json.Number).String() != "3236607068019569386" {
		t.Fatalf("bytes-hash batch %v", m)
	}
}

func TestInspectEventsMalformed(t *testing.T) {
	bad := filepath.Join(t.TempDir(), "bad.msgpack")
	good, err := os.ReadFile(fixturePath("vllm_batch_array_form.msgpack"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(bad, good[:40], 0o600); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	code := run([]string{"inspect", "events", "--file", bad}, &out, &errOut)
	if code != 1 || out.Len() != 0 || strings.Count(errOut.String(), "\n") != 1 || !strings.Contains(errOut.String(), "malformed") {
		t.Fatalf("exit %d, stdout %q, stderr %q", code, out.String(), errOut.String())
	}
	if code := run([]string{"inspect", "events"}, &out, &errOut); code != 2 {
		t.Fatalf("no source: exit %d", code)
	}
	// The subscriber's flags are not read with --file: refused by name.
	errOut.Reset()
	code = run([]string{"inspect", "events", "--file", bad, "--count", "3", "--bind"}, &out, &errOut)
	if e := errOut.String(); code != 2 || !strings.Contains(e, "--count is not read by a --file run") || !strings.Contains(e, "--bind is not read") {
		t.Fatalf("--file with --count --bind: exit %d, stderr %q", code, e)
	}
	// An endpoint that is no ZMQ endpoint, or a host name to bind, is a
	// command-line mistake (exit 2), as every other one.
	for _, args := range [][]string{{"--zmq", "localhost"}, {"--zmq", "tcp://localhost:5557", "--bind"}} {
		errOut.Reset()
		if code := run(append([]string{"inspect", "events", "--count", "1"}, args...), &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "localhost") {
			t.Errorf("%v: exit %d, stderr %q; want 2", args, code, errOut.String())
		}
	}
}

// TestInspectEventsZMQ follows a real publisher over loopback.
func TestInspectEventsZMQ(t *testing.T) {
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"inspect", "events", "--zmq", pub.Endpoint(), "--replay", pub.ReplayEndpoint(), "--count", "3"}, &out, &errOut)
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 0; ; i++ {
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 3 {
				t.Fatalf("want 3 lines, got %q", out.String())
			}
			// The output starts at the first live batch the late join
			// received (seq i carries hash i+1), then follows in sequence.
			var first uint64
			for j, l := range lines {
				ev := decodeJSON(t, l)["events"].([]any)[0].(map[string]any)
				h, err := strconv.ParseUint(ev["block_hashes"].([]any)[0].(json.Number).String(), 10, 64)
				if j == 0 {
					first = h
				}
				if err != nil || h != first+uint64(j) {
					t.Fatalf("line %d: %v (after hash %d)", j, ev, first)
				}
			}
			return
		case <-ctx.Done():
			t.Fatal("inspect events --zmq did not finish")
		case <-tick.C:
			b := kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{uint64(i + 1)}}}}
			if _, err := pub.Publish(&b); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestInspectEventsLiveOnly: without --from-start, the engine's replay
// buffer from before is not printed; the output starts at the first live
// batch. It used to be printed whole at the first live batch (with "lost"
// warnings for what it no longer held), so the flag made no difference
// (h-kvev finding 2).
func TestInspectEventsLiveOnly(t *testing.T) {
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	const history = 1000
	for i := range 5 { // before the tool: history
		b := kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{history + uint64(i)}}}}
		if _, err := pub.Publish(&b); err != nil {
			t.Fatal(err)
		}
	}
	var out, errOut bytes.Buffer
	done := make(chan int, 1)
	go func() {
		done <- run([]string{"inspect", "events", "--zmq", pub.Endpoint(), "--replay", pub.ReplayEndpoint(), "--count", "2"}, &out, &errOut)
	}()
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for i := 1; ; i++ {
		select {
		case code := <-done:
			if code != 0 {
				t.Fatalf("exit %d: %s", code, errOut.String())
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			if len(lines) != 2 || errOut.String() != "" {
				t.Fatalf("want 2 lines and no warning; got %q, stderr %q", out.String(), errOut.String())
			}
			for j, l := range lines {
				ev := decodeJSON(t, l)["events"].([]any)[0].(map[string]any)
				if h, err := strconv.ParseUint(ev["block_hashes"].([]any)[0].(json.Number).String(), 10, 64); err != nil || h >= history {
					t.Fatalf("line %d is the history's %v: want live batches only", j, ev)
				}
			}
			return
		case <-ctx.Done():
			t.Fatal("inspect events --zmq did not finish")
		case <-tick.C:
			b := kvevents.Batch{TS: 1, Events: []kvevents.Event{{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{uint64(i)}}}}
			if _, err := pub.Publish(&b); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// TestInspectEventsFromStart prints an idle engine's replay buffer.
func TestInspectEventsFromStart(t *testing.T) {
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*"})
	if err != nil {
		t.Fatal(err)
	}
	defer pub.Close()
	for i := 0; i < 3; i++ {
		b := kvevents.Batch{TS: float64(i), Events: []kvevents.Event{{Kind: kvevents.AllBlocksCleared}}}
		if _, err := pub.Publish(&b); err != nil {
			t.Fatal(err)
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"inspect", "events", "--zmq", pub.Endpoint(), "--replay", pub.ReplayEndpoint(), "--from-start", "--count", "3"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || decodeJSON(t, lines[2])["ts"].(json.Number).String() != "2" {
		t.Fatalf("output %q", out.String())
	}
	if code := run([]string{"inspect", "events", "--zmq", pub.Endpoint(), "--from-start"}, &out, &errOut); code != 2 {
		t.Fatalf("--from-start without --replay: exit %d", code)
	}
}
