package kvevents

// EventForm selects how AppendBatch encodes events. The envelope is always
// the array [ts, events, data_parallel_rank], as in every vLLM release.
type EventForm uint8

const (
	// ArrayForm encodes events as msgspec array_like tagged structs
	// ["BlockStored", field1, ...] (vLLM before PR #42892, SGLang before
	// 2026-09). Fields run through medium and then only as far as the last
	// non-default optional field, so an event that uses nothing newer is
	// written exactly as the engine version that introduced medium wrote it.
	// CacheSalt and SessionID have no fixed position and are not written.
	ArrayForm EventForm = iota
	// MapForm encodes events as msgspec tagged maps {"type": ..., ...} (vLLM
	// after PR #42892): required fields always, optional ones only when they
	// differ from their default (nil).
	MapForm
)

// String names the form (array, map).
func (f EventForm) String() string {
	if f == MapForm {
		return "map"
	}
	return "array"
}

// AppendBatch appends b encoded as a KVEventBatch payload to dst, byte for
// byte as msgspec encodes it (smallest int forms, float64 ts, nil for absent
// values). It allocates only when dst must grow.
func AppendBatch(dst []byte, b *Batch, form EventForm) []byte {
	dst = appendArrayHeader(dst, 3)
	dst = appendFloat64(dst, b.TS)
	dst = appendArrayHeader(dst, len(b.Events))
	for i := range b.Events {
		if form == MapForm {
			dst = appendMapEvent(dst, &b.Events[i])
		} else {
			dst = appendArrayEvent(dst, &b.Events[i])
		}
	}
	if b.HasDPRank {
		return appendInt(dst, int64(b.DPRank))
	}
	return append(dst, 0xc0)
}

func appendHashes(dst []byte, hs []uint64) []byte {
	dst = appendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = appendUint(dst, h)
	}
	return dst
}

func appendTokens(dst []byte, ts []uint32) []byte {
	dst = appendArrayHeader(dst, len(ts))
	for _, t := range ts {
		dst = appendUint(dst, uint64(t))
	}
	return dst
}

func appendOptInt(dst []byte, v int64, ok bool) []byte {
	if !ok {
		return append(dst, 0xc0)
	}
	return appendInt(dst, v)
}

func appendExtraKeys(dst []byte, raw []byte) []byte {
	if len(raw) == 0 {
		return append(dst, 0xc0)
	}
	return append(dst, raw...)
}

func appendArrayEvent(dst []byte, e *Event) []byte {
	switch e.Kind {
	case BlockStored:
		n := 7 // tag .. medium
		switch {
		case e.SlidingWindow != 0:
			n = 12
		case e.SpecKind != "":
			n = 11
		case e.HasGroupIdx:
			n = 10
		case len(e.ExtraKeys) > 0:
			n = 9
		case e.LoraName != "":
			n = 8
		}
		dst = appendArrayHeader(dst, n)
		dst = appendStr(dst, "BlockStored")
		dst = appendHashes(dst, e.BlockHashes)
		if e.HasParent {
			dst = appendUint(dst, e.ParentHash)
		} else {
			dst = append(dst, 0xc0)
		}
		dst = appendTokens(dst, e.TokenIDs)
		dst = appendInt(dst, int64(e.BlockSize))
		dst = appendOptInt(dst, e.LoraID, e.HasLoraID)
		dst = appendStrOrNil(dst, e.Medium)
		if n > 7 {
			dst = appendStrOrNil(dst, e.LoraName)
		}
		if n > 8 {
			dst = appendExtraKeys(dst, e.ExtraKeys)
		}
		if n > 9 {
			dst = appendOptInt(dst, e.GroupIdx, e.HasGroupIdx)
		}
		if n > 10 {
			dst = appendStrOrNil(dst, e.SpecKind)
		}
		if n > 11 {
			dst = appendOptInt(dst, e.SlidingWindow, e.SlidingWindow != 0)
		}
		return dst
	case BlockRemoved:
		n := 3
		if e.HasGroupIdx {
			n = 4
		}
		dst = appendArrayHeader(dst, n)
		dst = appendStr(dst, "BlockRemoved")
		dst = appendHashes(dst, e.BlockHashes)
		dst = appendStrOrNil(dst, e.Medium)
		if n > 3 {
			dst = appendInt(dst, e.GroupIdx)
		}
		return dst
	default:
		dst = appendArrayHeader(dst, 1)
		return appendStr(dst, AllBlocksCleared.String())
	}
}

func appendMapEvent(dst []byte, e *Event) []byte {
	switch e.Kind {
	case BlockStored:
		n := 8 // type + the seven fields without defaults
		opt := [...]bool{len(e.ExtraKeys) > 0, e.HasGroupIdx, e.SpecKind != "", e.SlidingWindow != 0, e.SessionID != "", e.CacheSalt != ""}
		for _, ok := range opt {
			if ok {
				n++
			}
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, "BlockStored")
		dst = appendStr(dst, "block_hashes")
		dst = appendHashes(dst, e.BlockHashes)
		dst = appendStr(dst, "parent_block_hash")
		if e.HasParent {
			dst = appendUint(dst, e.ParentHash)
		} else {
			dst = append(dst, 0xc0)
		}
		dst = appendStr(dst, "token_ids")
		dst = appendTokens(dst, e.TokenIDs)
		dst = appendStr(dst, "block_size")
		dst = appendInt(dst, int64(e.BlockSize))
		dst = appendStr(dst, "lora_id")
		dst = appendOptInt(dst, e.LoraID, e.HasLoraID)
		dst = appendStr(dst, "medium")
		dst = appendStrOrNil(dst, e.Medium)
		dst = appendStr(dst, "lora_name")
		dst = appendStrOrNil(dst, e.LoraName)
		if opt[0] {
			dst = appendStr(dst, "extra_keys")
			dst = append(dst, e.ExtraKeys...)
		}
		if opt[1] {
			dst = appendStr(dst, "group_idx")
			dst = appendInt(dst, e.GroupIdx)
		}
		if opt[2] {
			dst = appendStr(dst, "kv_cache_spec_kind")
			dst = appendStr(dst, e.SpecKind)
		}
		if opt[3] {
			dst = appendStr(dst, "kv_cache_spec_sliding_window")
			dst = appendInt(dst, e.SlidingWindow)
		}
		if opt[4] {
			dst = appendStr(dst, "session_id")
			dst = appendStr(dst, e.SessionID)
		}
		if opt[5] {
			dst = appendStr(dst, "cache_salt")
			dst = appendStr(dst, e.CacheSalt)
		}
		return dst
	case BlockRemoved:
		n := 3
		if e.HasGroupIdx {
			n = 4
		}
		dst = appendMapHeader(dst, n)
		dst = appendStr(dst, "type")
		dst = appendStr(dst, "BlockRemoved")
		dst = appendStr(dst, "block_hashes")
		dst = appendHashes(dst, e.BlockHashes)
		dst = appendStr(dst, "medium")
		dst = appendStrOrNil(dst, e.Medium)
		if e.HasGroupIdx {
			dst = appendStr(dst, "group_idx")
			dst = appendInt(dst, e.GroupIdx)
		}
		return dst
	default:
		dst = appendMapHeader(dst, 1)
		dst = appendStr(dst, "type")
		return appendStr(dst, AllBlocksCleared.String())
	}
}
