package learn

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// The wire form of a Share: what the ingress gossips (ingress/learn_gossip.go)
// and the orchestrator reads (orchestrator/slo.go). msgpack through the
// library's primitives, with the array lengths checked before anything is
// allocated for them.

// StateName is the gossip app-state key under which a router shares its
// own sums (the ingress publishes it; the orchestrator reads it).
const StateName = "kvmesh.learn.v1"

const (
	// MaxShareBytes keeps a share well under gossip's 4 KiB app limit.
	MaxShareBytes = 3 << 10
	// HeaderBytes is the most a share takes besides its engines: the
	// array headers, version, epoch and pooled sums.
	HeaderBytes = 17 + statsLen*9
	wireVersion = 1
	statsLen    = 5 + 9
	// maxWireID bounds an engine id on the wire (gossip engine ids are
	// DNS-label-like; 253 is a DNS name's limit).
	maxWireID = 253
)

// ErrWire wraps every reason a share does not decode.
var ErrWire = errors.New("learned-cost share: malformed")

// Share is one router's share as it travels.
type Share struct {
	// Epoch is random per learner: a router restarted under the same
	// name starts a new one, and its peers drop what the old one shared.
	Epoch   uint64
	Pooled  Stats
	Engines []EngineStats
}

// EntryBytes is the most bytes one engine's entry takes: array headers,
// the id's string header and bytes, 14 float64s.
func EntryBytes(id string) int { return 1 + 5 + len(id) + 3 + statsLen*9 }

func encodeStats(e *msgpack.Encoder, s *Stats) error {
	if err := e.EncodeArrayLen(statsLen); err != nil {
		return err
	}
	for _, v := range s.Prefill {
		if err := e.EncodeFloat64(v); err != nil {
			return err
		}
	}
	for _, v := range s.Decode {
		if err := e.EncodeFloat64(v); err != nil {
			return err
		}
	}
	return nil
}

// EncodeShare writes a share of pooled and engines under epoch into buf
// (msgpack, arrays only: [1, epoch, pooled, [[engine id, stats], …]],
// stats being the 14 sums of Stats, prefill's five then decode's nine).
func EncodeShare(buf *bytes.Buffer, epoch uint64, pooled *Stats, engines []EngineStats) error {
	buf.Reset()
	e := msgpack.NewEncoder(buf)
	e.UseCompactFloats(true) // a sum that is exactly a float32 (0, small counts) takes 5 bytes
	if err := e.EncodeArrayLen(4); err != nil {
		return err
	}
	if err := e.EncodeInt(wireVersion); err != nil {
		return err
	}
	if err := e.EncodeUint(epoch); err != nil {
		return err
	}
	if err := encodeStats(e, pooled); err != nil {
		return err
	}
	if err := e.EncodeArrayLen(len(engines)); err != nil {
		return err
	}
	for i := range engines {
		if err := e.EncodeArrayLen(2); err != nil {
			return err
		}
		if err := e.EncodeString(engines[i].Engine); err != nil {
			return err
		}
		if err := encodeStats(e, &engines[i].Stats); err != nil {
			return err
		}
	}
	return nil
}

// DecodeShare parses a share. It checks the shape and bounds only; the
// sums' plausibility is Stats.Check's (SetPeer runs it).
func DecodeShare(b []byte) (Share, error) {
	var sh Share
	r := bytes.NewReader(b)
	d := msgpack.NewDecoder(r)
	arr := func(want int) error {
		n, err := d.DecodeArrayLen()
		if err != nil {
			return fmt.Errorf("%w: %v", ErrWire, err)
		}
		if n != want {
			return fmt.Errorf("%w: array of %d, want %d", ErrWire, n, want)
		}
		return nil
	}
	stats := func(s *Stats) error {
		if err := arr(statsLen); err != nil {
			return err
		}
		for i := range statsLen {
			v, err := d.DecodeFloat64()
			if err != nil {
				return fmt.Errorf("%w: %v", ErrWire, err)
			}
			if i < len(s.Prefill) {
				s.Prefill[i] = v
			} else {
				s.Decode[i-len(s.Prefill)] = v
			}
		}
		return nil
	}
	if err := arr(4); err != nil {
		return sh, err
	}
	v, err := d.DecodeInt()
	if err != nil {
		return sh, fmt.Errorf("%w: version: %v", ErrWire, err)
	}
	if v != wireVersion {
		return sh, fmt.Errorf("%w: version %d, want %d", ErrWire, v, wireVersion)
	}
	if sh.Epoch, err = d.DecodeUint64(); err != nil {
		return sh, fmt.Errorf("%w: epoch: %v", ErrWire, err)
	}
	if err := stats(&sh.Pooled); err != nil {
		return sh, err
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return sh, fmt.Errorf("%w: %v", ErrWire, err)
	}
	// Each entry takes more than 16 bytes: a count beyond that is a lie
	// that would make us allocate for it.
	if n < 0 || n > len(b)/16 {
		return sh, fmt.Errorf("%w: %d engines in %d bytes", ErrWire, n, len(b))
	}
	sh.Engines = make([]EngineStats, n)
	for i := range sh.Engines {
		es := &sh.Engines[i]
		if err := arr(2); err != nil {
			return sh, err
		}
		if es.Engine, err = d.DecodeString(); err != nil {
			return sh, fmt.Errorf("%w: engine id: %v", ErrWire, err)
		}
		if es.Engine == "" || len(es.Engine) > maxWireID {
			return sh, fmt.Errorf("%w: engine id of %d bytes", ErrWire, len(es.Engine))
		}
		if err := stats(&es.Stats); err != nil {
			return sh, err
		}
	}
	if r.Len() != 0 {
		return sh, fmt.Errorf("%w: %d trailing bytes", ErrWire, r.Len())
	}
	return sh, nil
}
