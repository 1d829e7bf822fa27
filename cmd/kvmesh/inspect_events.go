package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"

	"github.com/kvmesh/kvmesh/kvevents"
)

// runInspectEvents decodes KV-event payloads and prints them as JSON: one
// payload from a file, or live batches from an engine's ZMQ socket.
func runInspectEvents(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("inspect events", stderr)
	file := fs.String("file", "", "decode one msgpack KVEventBatch payload from this file")
	zmqEP := fs.String("zmq", "", "subscribe to an engine's KV events, e.g. tcp://127.0.0.1:5557")
	replay := fs.String("replay", "", "the engine's replay endpoint, e.g. tcp://127.0.0.1:5558 (fills gaps)")
	topic := fs.String("topic", "", "topic prefix to subscribe to")
	dpSize := fs.Int("dp-size", 1, "number of DP ranks (ports offset by rank)")
	fromStart := fs.Bool("from-start", false, "with --replay: first print every batch still in the engine's replay buffer (without it, output starts at the first live batch)")
	bind := fs.Bool("bind", false, "with --zmq: bind the endpoint instead of connecting (for engines whose PUB connects)")
	count := fs.Int("count", 0, "with --zmq: exit after this many batches (0 = until interrupted)")
	fs.Usage = func() {
		fmt.Fprintln(stderr, "Usage: kvmesh inspect events --file PATH\n       kvmesh inspect events --zmq tcp://HOST:PORT [--replay tcp://HOST:PORT]")
		fs.PrintDefaults()
	}
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	switch {
	case (*file == "") == (*zmqEP == ""):
		return fmt.Errorf("%w: give exactly one of --file or --zmq", errUsage)
	case *file != "" && *replay != "":
		return fmt.Errorf("%w: --replay needs --zmq", errUsage)
	case *fromStart && *replay == "":
		return fmt.Errorf("%w: --from-start needs --replay", errUsage)
	case *count < 0 || *dpSize < 1:
		return fmt.Errorf("%w: --count must be >= 0 and --dp-size >= 1", errUsage)
	}
	if *file != "" {
		if err := refuseUnread(fs, "--file", func(f string) bool { return f == "file" }); err != nil {
			return err // the subscriber's flags (--bind, --count, --topic, --dp-size) would be ignored
		}
		payload, err := os.ReadFile(*file)
		if err != nil {
			return fmt.Errorf("read: %w", err)
		}
		var b kvevents.Batch
		if err := kvevents.DecodeBatch(payload, &b); err != nil {
			return fmt.Errorf("%s: %w", *file, err)
		}
		return writeBatchJSON(stdout, &b)
	}
	if *bind {
		if err := kvevents.CheckBindEndpoint(*zmqEP); err != nil { // ZMQ binds no host name ("no such device")
			return fmt.Errorf("%w: --zmq: %w", errUsage, err)
		}
	}
	return inspectZMQ(ctx, kvevents.SubscriberConfig{
		Endpoint:       *zmqEP,
		ReplayEndpoint: *replay,
		Topic:          *topic,
		DPSize:         *dpSize,
		Bind:           *bind,
		ReplayOnStart:  *fromStart,
		// Without --from-start, what is printed starts at the first live
		// batch: the engine's buffer from before is not replayed.
		LiveStart: !*fromStart,
		Logger:    slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}, *count, stdout, stderr)
}

func inspectZMQ(ctx context.Context, cfg kvevents.SubscriberConfig, count int, stdout, stderr io.Writer) error {
	sub, err := kvevents.NewSubscriber(cfg)
	if errors.Is(err, kvevents.ErrConfig) { // an endpoint that is no endpoint: a command-line mistake
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if err != nil {
		return err
	}
	defer sub.Close()
	for n := 0; count == 0 || n < count; {
		m, err := sub.Next(ctx)
		if errors.Is(err, context.Canceled) {
			return nil
		}
		if err != nil {
			return err
		}
		switch m.Kind {
		case kvevents.MsgBatch:
			if err := writeBatchJSON(stdout, m.Batch); err != nil {
				return err
			}
			n++
		case kvevents.MsgReset:
			fmt.Fprintf(stderr, "rank %d restarted: sequence went back to %d\n", m.Rank, m.Seq)
		case kvevents.MsgLostHistory:
			fmt.Fprintf(stderr, "rank %d: batches %d..%d lost\n", m.Rank, m.From, m.Seq-1)
		}
	}
	return nil
}

// jsonBatch and jsonEvent are the command's output contract (issue 2):
// hashes are unsigned 64-bit decimal integers.
type jsonBatch struct {
	TS     float64     `json:"ts"`
	DPRank *int        `json:"data_parallel_rank"`
	Events []jsonEvent `json:"events"`
}

type jsonEvent struct {
	Type        string   `json:"type"`
	BlockHashes []uint64 `json:"block_hashes,omitzero"`
	// ParentHash is written for BlockStored only, as an integer or null.
	ParentHash *parentHash `json:"parent_block_hash,omitzero"`
	TokenIDs   []uint32    `json:"token_ids,omitzero"`
	BlockSize  *int        `json:"block_size,omitzero"`
	Medium     *string     `json:"medium,omitzero"`
	LoraName   *string     `json:"lora_name,omitzero"`
	GroupIdx   *int64      `json:"group_idx,omitzero"`
}

// parentHash marshals as an integer or, when nil, null.
type parentHash struct {
	v  uint64
	ok bool
}

func (p parentHash) MarshalJSON() ([]byte, error) {
	if !p.ok {
		return []byte("null"), nil
	}
	return fmt.Appendf(nil, "%d", p.v), nil
}

func writeBatchJSON(w io.Writer, b *kvevents.Batch) error {
	if math.IsNaN(b.TS) || math.IsInf(b.TS, 0) {
		return fmt.Errorf("batch ts %v is not a finite number", b.TS)
	}
	out := jsonBatch{TS: b.TS, Events: make([]jsonEvent, 0, len(b.Events))}
	if b.HasDPRank {
		out.DPRank = &b.DPRank
	}
	for i := range b.Events {
		e := &b.Events[i]
		je := jsonEvent{Type: e.Kind.String()}
		if e.Kind != kvevents.AllBlocksCleared {
			je.BlockHashes = nonNil(e.BlockHashes)
			if e.Medium != "" {
				je.Medium = &e.Medium
			}
			if e.HasGroupIdx {
				je.GroupIdx = &e.GroupIdx
			}
		}
		if e.Kind == kvevents.BlockStored {
			je.ParentHash = &parentHash{e.ParentHash, e.HasParent}
			je.TokenIDs = nonNil(e.TokenIDs)
			je.BlockSize = &e.BlockSize
			if e.LoraName != "" {
				je.LoraName = &e.LoraName
			}
		}
		out.Events = append(out.Events, je)
	}
	line, err := json.Marshal(out)
	if err != nil {
		return fmt.Errorf("encode json: %w", err)
	}
	if _, err := w.Write(append(line, '\n')); err != nil {
		return fmt.Errorf("write: %w", err)
	}
	return nil
}

// nonNil keeps an empty list an empty list ([]) rather than dropping it.
func nonNil[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
