package sim

import (
	"encoding/json"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// pdBody is a decode leg's body: a prompt of n tokens, extra members
// besides the usual ones, and kv_transfer_params as the ingress sends it.
func pdBody(tb testing.TB, n, extra int) []byte {
	tb.Helper()
	m := decodeLeg(tokens(1, n), map[string]any{"do_remote_prefill": true, "do_remote_decode": false,
		"remote_block_ids": []int{1, 2, 3}, "remote_engine_id": "e", "remote_request_id": "r", "remote_host": "127.0.0.1",
		"remote_port": 5600, "tp_size": 1}, 4)
	for i := range extra {
		m[fmt.Sprintf("x%d", i)] = i
	}
	b, err := json.Marshal(m)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// TestDecodePDRequestAllocsFlat: reading a P/D leg's members costs the
// same allocations whatever else the body holds (a long prompt, many other
// members): they are scanned in place, not copied into a map per request.
func TestDecodePDRequestAllocsFlat(t *testing.T) {
	small, big := pdBody(t, 4, 0), pdBody(t, 4096, 64)
	var p *pdRequest
	allocs := func(body []byte) float64 {
		return testing.AllocsPerRun(50, func() { p, _ = decodePDRequest(body) })
	}
	a, b := allocs(small), allocs(big)
	if p == nil || p.KVTransferParams == nil || *p.KVTransferParams.RemoteRequestID != "r" {
		t.Fatalf("decoded %+v", p)
	}
	if a != b {
		t.Fatalf("%v allocations for a 4-token body, %v for 4096 tokens and 64 more members: want the same", a, b)
	}
	none := []byte(`{"model":"m","prompt":[1,2,3],"max_tokens":1,"kv_transfer_params":null}`)
	if n := testing.AllocsPerRun(50, func() { p, _ = decodePDRequest(none) }); n != 0 || p != nil {
		t.Fatalf("a body naming no P/D leg: %v allocations, %+v", n, p)
	}
}

// TestDecodePDRequestAsMap: the scan reads what encoding/json's map
// reading reads (the fallback for what the scanner refuses): exact names,
// the last repeated member, escaped keys, wrong types, not an object, and
// a body nested deeper than the scanner's limit.
func TestDecodePDRequestAsMap(t *testing.T) {
	deep := `{"model":"m","metadata":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `,"bootstrap_room":7,"bootstrap_host":"h"}`
	for _, body := range []string{
		`{"kv_transfer_params":{"do_remote_decode":true}}`,
		`{"KV_Transfer_Params":{"do_remote_decode":true},"metadata":{"kv_transfer_params":1}}`,
		`{"kv_transfer_params":{"remote_host":"a","remote_port":1},"kv_transfer_params":{"do_remote_decode":true}}`,
		`{"kv_transfer\u005fparams":{"do_remote_decode":true}}`,
		`{"kv_transfer_params":{"remote_port":"x"}}`,
		`{"bootstrap_port":"x"}`,
		`{"bootstrap_port":1}`,
		`{"bootstrap_room":18446744073709551615,"bootstrap_host":"h","bootstrap_port":8998}`,
		`{"bootstrap_room":-1}`,
		`{"kv_transfer_params":null}`,
		`{"kv_transfer_params":{"do_remote_decode":true}} x`,
		`[{"kv_transfer_params":{}}]`,
		`{"kv_transfer_params":{}`,
		deep,
	} {
		got, gerr := decodePDRequest([]byte(body))
		want, werr := decodePDRequestMap([]byte(body))
		if !reflect.DeepEqual(got, want) || (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
			t.Errorf("%.80s: got %+v, %v; the map reading %+v, %v", body, got, gerr, want, werr)
		}
	}
	if p, _ := decodePDRequest([]byte(deep)); p == nil || p.BootstrapRoom == nil || *p.BootstrapRoom != 7 {
		t.Fatalf("a body nested past the scanner's limit: %+v", p)
	}
}

// FuzzDecodePDRequest: the scan and the map reading agree on any body.
func FuzzDecodePDRequest(f *testing.F) {
	f.Add([]byte(`{"kv_transfer_params":{"do_remote_decode":true},"prompt":[1,2]}`))
	f.Add([]byte(`{"bootstrap_room":1,"bootstrap_host":"h","bootstrap_port":2,"bootstrap_room":3}`))
	f.Add([]byte(`{"kv_transfer_params":{"remote_block_ids":[1,"x"]}}`))
	f.Fuzz(func(t *testing.T, body []byte) {
		got, gerr := decodePDRequest(body)
		want, werr := decodePDRequestMap(body)
		if !reflect.DeepEqual(got, want) || (gerr == nil) != (werr == nil) || (gerr != nil && gerr.Error() != werr.Error()) {
			t.Fatalf("%q: got %+v, %v; the map reading %+v, %v", body, got, gerr, want, werr)
		}
	})
}

// BenchmarkDecodePDRequest reads a decode leg's P/D members from a body
// with a 1024-token prompt: "map" is the reading through a map of every
// member (before; now only the fallback), "scan" the in-place scan.
func BenchmarkDecodePDRequest(b *testing.B) {
	body := pdBody(b, 1024, 0)
	for _, bc := range []struct {
		name string
		fn   func([]byte) (*pdRequest, error)
	}{{"map", decodePDRequestMap}, {"scan", decodePDRequest}} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				if p, err := bc.fn(body); p == nil || err != nil {
					b.Fatal(p, err)
				}
			}
		})
	}
}
