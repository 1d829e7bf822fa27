package kvtest

import (
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/internal/wire"
)

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
func AppendBatch(dst []byte, b *kvevents.Batch, form EventForm) []byte {
	dst = wire.AppendArrayHeader(dst, 3)
	dst = wire.AppendFloat64(dst, b.TS)
	dst = wire.AppendArrayHeader(dst, len(b.Events))
	for i := range b.Events {
		if form == MapForm {
			dst = appendMapEvent(dst, &b.Events[i])
		} else {
			dst = appendArrayEvent(dst, &b.Events[i])
		}
	}
	if b.HasDPRank {
		return wire.AppendInt(dst, int64(b.DPRank))
	}
	return append(dst, 0xc0)
}

func appendHashes(dst []byte, hs []uint64) []byte {
	dst = wire.AppendArrayHeader(dst, len(hs))
	for _, h := range hs {
		dst = wire.AppendUint(dst, h)
	}
	return dst
}

func appendTokens(dst []byte, ts []uint32) []byte {
	dst = wire.AppendArrayHeader(dst, len(ts))
	for _, t := range ts {
		dst = wire.AppendUint(dst, uint64(t))
	}
	return dst
}

func appendOptInt(dst []byte, v int64, ok bool) []byte {
	if !ok {
		return append(dst, 0xc0)
	}
	return wire.AppendInt(dst, v)
}

func appendExtraKeys(dst []byte, raw []byte) []byte {
	if len(raw) == 0 {
		return append(dst, 0xc0)
	}
	return append(dst, raw...)
}

func appendArrayEvent(dst []byte, e *kvevents.Event) []byte {
	switch e.Kind {
	case kvevents.BlockStored:
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
		dst = wire.AppendArrayHeader(dst, n)
		dst = wire.AppendStr(dst, "BlockStored")
		dst = appendHashes(dst, e.BlockHashes)
		if e.HasParent {
			dst = wire.AppendUint(dst, e.ParentHash)
		} else {
			dst = append(dst, 0xc0)
		}
		dst = appendTokens(dst, e.TokenIDs)
		dst = wire.AppendInt(dst, int64(e.BlockSize))
		dst = appendOptInt(dst, e.LoraID, e.HasLoraID)
		dst = wire.AppendStrOrNil(dst, e.Medium)
		if n > 7 {
			dst = wire.AppendStrOrNil(dst, e.LoraName)
		}
		if n > 8 {
			dst = appendExtraKeys(dst, e.ExtraKeys)
		}
		if n > 9 {
			dst = appendOptInt(dst, e.GroupIdx, e.HasGroupIdx)
		}
		if n > 10 {
			dst = wire.AppendStrOrNil(dst, e.SpecKind)
		}
		if n > 11 {
			dst = appendOptInt(dst, e.SlidingWindow, e.SlidingWindow != 0)
		}
		return dst
	case kvevents.BlockRemoved:
		n := 3
		if e.HasGroupIdx {
			n = 4
		}
		dst = wire.AppendArrayHeader(dst, n)
		dst = wire.AppendStr(dst, "BlockRemoved")
		dst = appendHashes(dst, e.BlockHashes)
		dst = wire.AppendStrOrNil(dst, e.Medium)
		if n > 3 {
			dst = wire.AppendInt(dst, e.GroupIdx)
		}
		return dst
	default:
		dst = wire.AppendArrayHeader(dst, 1)
		return wire.AppendStr(dst, kvevents.AllBlocksCleared.String())
	}
}

func appendMapEvent(dst []byte, e *kvevents.Event) []byte {
	switch e.Kind {
	case kvevents.BlockStored:
		n := 8 // type + the seven fields without defaults
		opt := [...]bool{len(e.ExtraKeys) > 0, e.HasGroupIdx, e.SpecKind != "", e.SlidingWindow != 0, e.SessionID != "", e.CacheSalt != ""}
		for _, ok := range opt {
			if ok {
				n++
			}
		}
		dst = wire.AppendMapHeader(dst, n)
		dst = wire.AppendStr(dst, "type")
		dst = wire.AppendStr(dst, "BlockStored")
		dst = wire.AppendStr(dst, "block_hashes")
		dst = appendHashes(dst, e.BlockHashes)
		dst = wire.AppendStr(dst, "parent_block_hash")
		if e.HasParent {
			dst = wire.AppendUint(dst, e.ParentHash)
		} else {
			dst = append(dst, 0xc0)
		}
		dst = wire.AppendStr(dst, "token_ids")
		dst = appendTokens(dst, e.TokenIDs)
		dst = wire.AppendStr(dst, "block_size")
		dst = wire.AppendInt(dst, int64(e.BlockSize))
		dst = wire.AppendStr(dst, "lora_id")
		dst = appendOptInt(dst, e.LoraID, e.HasLoraID)
		dst = wire.AppendStr(dst, "medium")
		dst = wire.AppendStrOrNil(dst, e.Medium)
		dst = wire.AppendStr(dst, "lora_name")
		dst = wire.AppendStrOrNil(dst, e.LoraName)
		if opt[0] {
			dst = wire.AppendStr(dst, "extra_keys")
			dst = append(dst, e.ExtraKeys...)
		}
		if opt[1] {
			dst = wire.AppendStr(dst, "group_idx")
			dst = wire.AppendInt(dst, e.GroupIdx)
		}
		if opt[2] {
			dst = wire.AppendStr(dst, "kv_cache_spec_kind")
			dst = wire.AppendStr(dst, e.SpecKind)
		}
		if opt[3] {
			dst = wire.AppendStr(dst, "kv_cache_spec_sliding_window")
			dst = wire.AppendInt(dst, e.SlidingWindow)
		}
		if opt[4] {
			dst = wire.AppendStr(dst, "session_id")
			dst = wire.AppendStr(dst, e.SessionID)
		}
		if opt[5] {
			dst = wire.AppendStr(dst, "cache_salt")
			dst = wire.AppendStr(dst, e.CacheSalt)
		}
		return dst
	case kvevents.BlockRemoved:
		n := 3
		if e.HasGroupIdx {
			n = 4
		}
		dst = wire.AppendMapHeader(dst, n)
		dst = wire.AppendStr(dst, "type")
		dst = wire.AppendStr(dst, "BlockRemoved")
		dst = wire.AppendStr(dst, "block_hashes")
		dst = appendHashes(dst, e.BlockHashes)
		dst = wire.AppendStr(dst, "medium")
		dst = wire.AppendStrOrNil(dst, e.Medium)
		if e.HasGroupIdx {
			dst = wire.AppendStr(dst, "group_idx")
			dst = wire.AppendInt(dst, e.GroupIdx)
		}
		return dst
	default:
		dst = wire.AppendMapHeader(dst, 1)
		dst = wire.AppendStr(dst, "type")
		return wire.AppendStr(dst, kvevents.AllBlocksCleared.String())
	}
}
