package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
)

// DecodeBatch decodes one KVEventBatch payload (frame 2 of a live message)
// into dst, in every form of the spec: array or map envelopes with 2 or 3
// fields, array- or map-encoded events, hashes as ints of any width and sign
// or as bin digests (folded), token ids as ints or as SGLang's bigram pairs
// [t_j, t_j+1] (EAGLE; t_j is kept), missing trailing fields and unknown
// extra fields or keys. Events of unknown types are skipped and counted in dst.Skipped.
//
// dst's slices (Events and each event's BlockHashes, TokenIDs, ExtraKeys) are
// reused, so a caller decoding into the same Batch allocates nothing once
// capacities have grown. Strings are interned for common values and copied
// otherwise: nothing in dst aliases payload.
//
// A malformed payload returns an error wrapping ErrBadPayload and leaves dst
// in an unspecified (but safe to reuse) state. DecodeBatch never panics.
func DecodeBatch(payload []byte, dst *Batch) error {
	dst.TS, dst.DPRank, dst.HasDPRank, dst.Skipped = 0, 0, false, 0
	dst.Events = dst.Events[:0]
	r := reader{b: payload}
	c, err := r.peek()
	if err != nil {
		return fmt.Errorf("decode batch: %w", err)
	}
	switch {
	case isArray(c):
		err = decodeArrayEnvelope(&r, dst)
	case isMap(c):
		err = decodeMapEnvelope(&r, dst)
	default:
		err = r.errf("envelope: want array or map, got type byte 0x%02x", c)
	}
	if err == nil && r.remaining() != 0 {
		err = r.errf("%d trailing bytes after the batch", r.remaining())
	}
	if err != nil {
		return fmt.Errorf("decode batch: %w", err)
	}
	return nil
}

func decodeArrayEnvelope(r *reader, dst *Batch) error {
	n, err := r.arrayLen()
	if err != nil {
		return err
	}
	if n < 2 {
		return r.errf("envelope has %d fields, want at least [ts, events]", n)
	}
	if dst.TS, err = r.float(); err != nil {
		return fmt.Errorf("ts: %w", err)
	}
	if err := decodeEvents(r, dst); err != nil {
		return err
	}
	if n >= 3 {
		if err := decodeRank(r, dst); err != nil {
			return err
		}
	}
	for i := 3; i < n; i++ { // fields of a future envelope
		if err := r.skip(); err != nil {
			return err
		}
	}
	return nil
}

func decodeMapEnvelope(r *reader, dst *Batch) error {
	n, err := r.mapLen()
	if err != nil {
		return err
	}
	sawEvents := false
	for i := 0; i < n; i++ {
		key, err := r.str()
		if err != nil {
			return fmt.Errorf("envelope key: %w", err)
		}
		switch string(key) {
		case "ts":
			if dst.TS, err = r.float(); err != nil {
				return fmt.Errorf("ts: %w", err)
			}
		case "events":
			sawEvents = true
			err = decodeEvents(r, dst)
		case "data_parallel_rank", "attn_dp_rank", "dp_rank":
			err = decodeRank(r, dst)
		default:
			err = r.skip()
		}
		if err != nil {
			return err
		}
	}
	if !sawEvents {
		return r.errf("map envelope without events")
	}
	return nil
}

func decodeRank(r *reader, dst *Batch) error {
	if r.nextNil() {
		dst.DPRank, dst.HasDPRank = 0, false
		return nil
	}
	v, err := r.int64v("data_parallel_rank")
	if err != nil {
		return err
	}
	if v < 0 || v > math.MaxInt32 {
		return r.errf("data_parallel_rank %d out of range", v)
	}
	dst.DPRank, dst.HasDPRank = int(v), true
	return nil
}

func decodeEvents(r *reader, dst *Batch) error {
	if r.nextNil() {
		return nil
	}
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("events: %w", err)
	}
	for i := 0; i < n; i++ {
		ev := dst.nextEvent()
		c, err := r.peek()
		if err != nil {
			return err
		}
		known := false
		switch {
		case isArray(c):
			known, err = decodeArrayEvent(r, ev)
		case isMap(c):
			known, err = decodeMapEvent(r, ev)
		default:
			err = r.errf("want array or map, got type byte 0x%02x", c)
		}
		if err != nil {
			return fmt.Errorf("event %d: %w", i, err)
		}
		if !known {
			dst.Events = dst.Events[:len(dst.Events)-1]
			dst.Skipped++
			continue
		}
		ev.normalize()
	}
	return nil
}

// nextEvent extends Events by one zeroed event, reusing the slices of a
// previously decoded event in that position.
func (b *Batch) nextEvent() *Event {
	if len(b.Events) < cap(b.Events) {
		b.Events = b.Events[:len(b.Events)+1]
		e := &b.Events[len(b.Events)-1]
		*e = Event{BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0], ExtraKeys: e.ExtraKeys[:0]}
		return e
	}
	b.Events = append(b.Events, Event{})
	return &b.Events[len(b.Events)-1]
}

// normalize clears fields that do not belong to the event's kind (a map may
// carry any key), so equal events compare equal.
func (e *Event) normalize() {
	switch e.Kind {
	case BlockRemoved:
		*e = Event{Kind: BlockRemoved, BlockHashes: e.BlockHashes, TokenIDs: e.TokenIDs[:0], ExtraKeys: e.ExtraKeys[:0],
			Medium: e.Medium, GroupIdx: e.GroupIdx, HasGroupIdx: e.HasGroupIdx}
	case AllBlocksCleared:
		*e = Event{Kind: AllBlocksCleared, BlockHashes: e.BlockHashes[:0], TokenIDs: e.TokenIDs[:0], ExtraKeys: e.ExtraKeys[:0]}
	}
}

func kindOf(tag []byte) EventKind {
	switch string(tag) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

// field identifies a known event field; fieldUnknown values are skipped.
type field uint8

const (
	fieldUnknown field = iota
	fieldBlockHashes
	fieldParent
	fieldTokenIDs
	fieldBlockSize
	fieldLoraID
	fieldMedium
	fieldLoraName
	fieldExtraKeys
	fieldGroupIdx
	fieldSpecKind
	fieldSlidingWindow
	fieldCacheSalt
	fieldSessionID
)

// Positional field order (spec §2); index 0 is the tag. Fields after these
// (locality, ownership, session_id ...) differ between versions and are
// skipped in arrays; maps name them.
var (
	storedFields = [...]field{1: fieldBlockHashes, fieldParent, fieldTokenIDs, fieldBlockSize, fieldLoraID, fieldMedium,
		fieldLoraName, fieldExtraKeys, fieldGroupIdx, fieldSpecKind, fieldSlidingWindow}
	removedFields = [...]field{1: fieldBlockHashes, fieldMedium, fieldGroupIdx}
)

// fieldByName maps a map key to its field without allocating.
func fieldByName(key []byte) field {
	switch string(key) {
	case "block_hashes":
		return fieldBlockHashes
	case "parent_block_hash":
		return fieldParent
	case "token_ids":
		return fieldTokenIDs
	case "block_size":
		return fieldBlockSize
	case "lora_id":
		return fieldLoraID
	case "medium":
		return fieldMedium
	case "lora_name":
		return fieldLoraName
	case "extra_keys":
		return fieldExtraKeys
	case "group_idx":
		return fieldGroupIdx
	case "kv_cache_spec_kind":
		return fieldSpecKind
	case "kv_cache_spec_sliding_window":
		return fieldSlidingWindow
	case "cache_salt":
		return fieldCacheSalt
	case "session_id":
		return fieldSessionID
	}
	return fieldUnknown
}

// decodeArrayEvent decodes ["Tag", field1, ...] positionally: shorter arrays
// leave later fields at their defaults, longer ones have the extras skipped.
func decodeArrayEvent(r *reader, ev *Event) (bool, error) {
	n, err := r.arrayLen()
	if err != nil {
		return false, err
	}
	if n == 0 {
		return false, r.errf("empty event array")
	}
	tag, err := r.str()
	if err != nil {
		return false, fmt.Errorf("event tag: %w", err)
	}
	ev.Kind = kindOf(tag)
	var names []field
	switch ev.Kind {
	case BlockStored:
		names = storedFields[:]
	case BlockRemoved:
		names = removedFields[:]
	}
	for i := 1; i < n; i++ {
		if i < len(names) {
			err = decodeField(r, ev, names[i])
		} else {
			err = r.skip()
		}
		if err != nil {
			return false, err
		}
	}
	return ev.Kind != 0, nil
}

// decodeMapEvent decodes {"type": "Tag", name: value, ...} by key.
func decodeMapEvent(r *reader, ev *Event) (bool, error) {
	n, err := r.mapLen()
	if err != nil {
		return false, err
	}
	sawType := false
	for i := 0; i < n; i++ {
		key, err := r.str()
		if err != nil {
			return false, fmt.Errorf("event key: %w", err)
		}
		if string(key) == "type" {
			tag, err := r.str()
			if err != nil {
				return false, fmt.Errorf("event type: %w", err)
			}
			ev.Kind, sawType = kindOf(tag), true
			continue
		}
		f := fieldByName(key)
		if sawType && ev.Kind == 0 {
			f = fieldUnknown // an unknown event type's fields are not ours to check
		}
		if err := decodeField(r, ev, f); err != nil {
			return false, err
		}
	}
	if !sawType {
		return false, r.errf("event map without type")
	}
	return ev.Kind != 0, nil
}

// decodeField decodes one named field into ev; unknown names are skipped.
// Every field accepts nil as "absent".
func decodeField(r *reader, ev *Event, f field) error {
	if r.nextNil() {
		return nil
	}
	var err error
	switch f {
	case fieldBlockHashes:
		err = decodeHashes(r, ev)
	case fieldParent:
		ev.ParentHash, err = r.hash()
		ev.HasParent = err == nil
	case fieldTokenIDs:
		err = decodeTokens(r, ev)
	case fieldBlockSize:
		var v int64
		v, err = r.int64v(f.String())
		if err == nil && (v < 0 || v > math.MaxInt32) {
			err = r.errf("block_size %d out of range", v)
		}
		ev.BlockSize = int(v)
	case fieldLoraID:
		ev.LoraID, err = r.int64v(f.String())
		ev.HasLoraID = err == nil
	case fieldMedium:
		ev.Medium, err = r.internedStr(f.String())
	case fieldLoraName:
		ev.LoraName, err = r.internedStr(f.String())
	case fieldSpecKind:
		ev.SpecKind, err = r.internedStr(f.String())
	case fieldCacheSalt:
		ev.CacheSalt, err = r.internedStr(f.String())
	case fieldSessionID:
		ev.SessionID, err = r.internedStr(f.String())
	case fieldSlidingWindow:
		ev.SlidingWindow, err = r.int64v(f.String())
	case fieldGroupIdx:
		ev.GroupIdx, err = r.int64v(f.String())
		ev.HasGroupIdx = err == nil
	case fieldExtraKeys:
		start := r.off
		if err = r.skip(); err == nil {
			ev.ExtraKeys = append(ev.ExtraKeys[:0], r.b[start:r.off]...)
		}
	default:
		err = r.skip()
	}
	return err
}

func decodeHashes(r *reader, ev *Event) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("block_hashes: %w", err)
	}
	// A repeated key replaces the earlier value (map semantics); before, it
	// appended or replaced depending on the reused capacity.
	ev.BlockHashes = ev.BlockHashes[:0]
	if cap(ev.BlockHashes) < n {
		ev.BlockHashes = make([]uint64, 0, n)
	}
	for i := 0; i < n; i++ {
		h, err := r.hash()
		if err != nil {
			return fmt.Errorf("block_hashes[%d]: %w", i, err)
		}
		ev.BlockHashes = append(ev.BlockHashes, h)
	}
	return nil
}

func decodeTokens(r *reader, ev *Event) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("token_ids: %w", err)
	}
	if cap(ev.TokenIDs) < n {
		ev.TokenIDs = make([]uint32, 0, n)
	}
	toks := ev.TokenIDs[:n]
	b, off := r.b, r.off
	for i := range toks {
		// Fast paths for the unsigned forms msgspec writes for token ids;
		// anything else (or a short buffer) takes the general path.
		if off < len(b) {
			switch c := b[off]; {
			case c <= 0x7f:
				toks[i] = uint32(c)
				off++
				continue
			case c == 0xcd && off+2 < len(b):
				toks[i] = uint32(binary.BigEndian.Uint16(b[off+1:]))
				off += 3
				continue
			case c == 0xce && off+4 < len(b):
				toks[i] = binary.BigEndian.Uint32(b[off+1:])
				off += 5
				continue
			}
		}
		r.off = off
		if off < len(b) && isArray(b[off]) {
			// SGLang with EAGLE/MTP (bigram radix keys) sends each position as
			// the pair (token[j], token[j+1]): the position's token is the first.
			if err := r.bigram(&toks[i]); err != nil {
				return fmt.Errorf("token_ids[%d]: %w", i, err)
			}
			off = r.off
			continue
		}
		v, neg, err := r.integer()
		if err != nil {
			return fmt.Errorf("token_ids[%d]: %w", i, err)
		}
		if neg || v > math.MaxUint32 {
			return r.errf("token_ids[%d]: %d is not a uint32 token id", i, int64(v))
		}
		toks[i] = uint32(v)
		off = r.off
	}
	r.off = off
	ev.TokenIDs = toks
	return nil
}

// bigram reads a bigram pair [t_j, t_j+1] of token ids and stores t_j in t.
func (r *reader) bigram(t *uint32) error {
	n, err := r.arrayLen()
	if err != nil {
		return fmt.Errorf("bigram: %w", err)
	}
	if n != 2 {
		return r.errf("bigram of %d token ids, want 2", n)
	}
	for k := 0; k < 2; k++ {
		v, neg, err := r.integer()
		if err != nil {
			return fmt.Errorf("bigram: %w", err)
		}
		if neg || v > math.MaxUint32 {
			return r.errf("bigram: %d is not a uint32 token id", int64(v))
		}
		if k == 0 {
			*t = uint32(v)
		}
	}
	return nil
}

// internedStr reads a string field, returning shared constants for the values
// every batch repeats so the hot path does not allocate.
func (r *reader) internedStr(field string) (string, error) {
	b, err := r.str()
	if err != nil {
		return "", fmt.Errorf("%s: %w", field, err)
	}
	switch string(b) {
	case "":
		return "", nil
	case "GPU":
		return "GPU", nil
	case "CPU":
		return "CPU", nil
	case "CPU_TIER1":
		return "CPU_TIER1", nil
	case "CPU_TIER2":
		return "CPU_TIER2", nil
	case "STORAGE":
		return "STORAGE", nil
	case "full_attention":
		return "full_attention", nil
	case "sliding_window":
		return "sliding_window", nil
	}
	return string(b), nil
}

// String names the field as on the wire (for error messages).
func (f field) String() string {
	if int(f) < len(fieldNames) {
		return fieldNames[f]
	}
	return "unknown"
}

var fieldNames = [...]string{"unknown", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
	"lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "cache_salt", "session_id"}
