package kvevents_test

import (
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
)

// storedKeys keys a 2-block (bs 4) BlockStored event of tokens 1..8.
func storedKeys(ev kvevents.Event, parent uint64) []uint64 {
	ev.Kind, ev.TokenIDs, ev.BlockSize = kvevents.BlockStored, seq32(1, 8), 4
	if ev.BlockHashes == nil {
		ev.BlockHashes = []uint64{11, 12}
	}
	return kvevents.AppendStoredKeys(nil, "m", &ev, parent, 2, 4)
}

func textKeys(root uint64) []uint64 { return kvevents.AppendKeys(nil, root, seq32(1, 8), 4) }

// vLLM sends a request's cache_salt (and LoRA name) only in extra_keys: the
// sidecar's keys must be the ones the ingress computes for that request,
// Root(model, lora, salt) chained over the tokens.
func TestStoredKeysFromVLLMExtraKeys(t *testing.T) {
	plain := textKeys(kvevents.Root("m", "", ""))
	for _, tc := range []struct {
		name string
		ev   kvevents.Event
		want []uint64
	}{
		{"no extra keys", kvevents.Event{}, plain},
		{"all-nil entries (vLLM, plain request)", kvevents.Event{ExtraKeys: mp(byte(0x92), byte(0xc0), byte(0xc0))}, plain},
		{"salt in block 0", kvevents.Event{ExtraKeys: kvevents.AppendExtraKeys(nil, 2, true, "", "tenant-a")},
			textKeys(kvevents.Root("m", "", "tenant-a"))},
		{"LoRA name in every block, salt in block 0",
			kvevents.Event{LoraName: "sql", LoraID: 1, HasLoraID: true, ExtraKeys: kvevents.AppendExtraKeys(nil, 2, true, "sql", "s")},
			textKeys(kvevents.Root("m", "sql", "s"))},
		{"lora_id and the name only in extra keys",
			kvevents.Event{LoraID: 3, HasLoraID: true, ExtraKeys: kvevents.AppendExtraKeys(nil, 2, true, "sql", "")},
			textKeys(kvevents.Root("m", "sql", ""))},
		{"cache_salt field (SGLang maps)", kvevents.Event{CacheSalt: "s"}, textKeys(kvevents.Root("m", "", "s"))},
		{"lora_id alone (vLLM before lora_name)", kvevents.Event{LoraID: 1, HasLoraID: true},
			textKeys(kvevents.LoRAIDRoot("m", 1, ""))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := storedKeys(tc.ev, 0); !slices.Equal(got, tc.want) {
				t.Fatalf("keys %x, want %x", got, tc.want)
			}
		})
	}
	if kvevents.LoRAIDRoot("m", 1, "") == kvevents.Root("m", "", "") || kvevents.LoRAIDRoot("m", 1, "") == kvevents.LoRAIDRoot("m", 2, "") {
		t.Fatal("lora-id roots alias the base model or each other")
	}
	// A continuation (parent known) of a LoRA request chains from the parent.
	parent := plain[0]
	ev := kvevents.Event{HasParent: true, ParentHash: 7, LoraName: "sql", HasLoraID: true, LoraID: 1,
		ExtraKeys: kvevents.AppendExtraKeys(nil, 2, false, "sql", "")}
	if got, want := storedKeys(ev, parent), kvevents.AppendKeys(nil, parent, seq32(1, 8), 4); !slices.Equal(got, want) {
		t.Fatalf("continuation keys %x, want %x", got, want)
	}
}

// Extra keys the ingress cannot reproduce (multimodal identifiers, prompt
// embeds, unexpected shapes) key the block and its descendants in a space no
// text request reaches, and different images never share keys.
func TestStoredKeysOpaqueExtraKeys(t *testing.T) {
	text := map[uint64]bool{}
	for _, root := range []uint64{kvevents.Root("m", "", ""), kvevents.Root("m", "", "s"), kvevents.Root("m", "sql", "")} {
		for _, k := range textKeys(root) {
			text[k] = true
		}
	}
	img := func(id string) []byte { return mp(byte(0x92), byte(0x91), byte(0x92), id, 0, byte(0xc0)) }
	cases := map[string]kvevents.Event{
		"image a":                 {ExtraKeys: img("img-a")},
		"image b":                 {ExtraKeys: img("img-b")},
		"image a, salted":         {ExtraKeys: mp(byte(0x92), byte(0x92), byte(0x92), "img-a", 0, "s", byte(0xc0))},
		"prompt embeds":           {ExtraKeys: mp(byte(0x92), byte(0x91), []byte{0xc4, 2, 1, 2}, byte(0x91), []byte{0xc4, 2, 3, 4})},
		"string after the salt":   {ExtraKeys: mp(byte(0x92), byte(0x92), "s", "t", byte(0xc0))},
		"wrong LoRA name":         {LoraName: "sql", ExtraKeys: kvevents.AppendExtraKeys(nil, 2, true, "other", "")},
		"not a list":              {ExtraKeys: mp(byte(0x81), "a", 1)},
		"one entry for 2 blocks":  {ExtraKeys: mp(byte(0x91), byte(0x91), "s")},
		"entry not a tuple":       {ExtraKeys: mp(byte(0x92), 5, byte(0xc0))},
		"salt after block 0 (??)": {HasParent: true, ExtraKeys: mp(byte(0x92), byte(0x91), "s", byte(0xc0))},
	}
	seen := map[uint64]string{}
	for name, ev := range cases {
		for i, k := range storedKeys(ev, kvevents.Root("m", "", "")) {
			if text[k] {
				t.Fatalf("%s: block %d has a text request's key", name, i)
			}
			if other, dup := seen[k]; dup {
				t.Fatalf("%s and %s share key %x", name, other, k)
			}
			seen[k] = name
		}
	}
}

// Keying a salted event allocates nothing (the sidecar's ingest hot path).
func TestStoredKeysAllocFree(t *testing.T) {
	ev := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: seq32(1, 8), BlockSize: 4,
		LoraName: "sql", HasLoraID: true, LoraID: 1, ExtraKeys: kvevents.AppendExtraKeys(nil, 2, true, "sql", "tenant-a")}
	mm := ev
	mm.ExtraKeys = mp(byte(0x92), byte(0x92), "sql", byte(0x92), "img", 0, byte(0x91), "sql")
	dst := make([]uint64, 0, 4)
	if n := testing.AllocsPerRun(100, func() {
		dst = kvevents.AppendStoredKeys(dst[:0], "m", &ev, 0, 2, 4)
		dst = kvevents.AppendStoredKeys(dst[:0], "m", &mm, 0, 2, 4)
	}); n != 0 {
		t.Fatalf("%v allocations per event", n)
	}
}

// FuzzStoredKeys: any extra_keys bytes key every block and never panic.
func FuzzStoredKeys(f *testing.F) {
	f.Add(kvevents.AppendExtraKeys(nil, 2, true, "sql", "s"), true)
	f.Add(mp(byte(0x92), byte(0x92), byte(0x92), "img", 0, "s", byte(0xc0)), false)
	f.Add(mp(byte(0x92), byte(0x91), []byte{0xc4, 1, 1}, byte(0xdc)), true)
	f.Fuzz(func(t *testing.T, extra []byte, lora bool) {
		ev := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: seq32(1, 8), BlockSize: 4, ExtraKeys: extra}
		if lora {
			ev.LoraID, ev.HasLoraID = 1, true
		}
		if got := kvevents.AppendStoredKeys(nil, "m", &ev, 0, 2, 4); len(got) != 2 {
			t.Fatalf("%d keys for 2 blocks", len(got))
		}
	})
}
