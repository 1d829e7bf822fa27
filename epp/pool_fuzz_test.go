package epp

import (
	"errors"
	"maps"
	"slices"
	"testing"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

// FuzzParsePoolSpec reads InferencePool objects decoded as the dynamic
// client decodes them (integers as int64): an unusable one is ErrBadPool,
// never a panic; a usable one has a selector and only ports in 1-65535,
// exactly the spec's, as a typed decode of the same JSON reads them.
func FuzzParsePoolSpec(f *testing.F) {
	for _, s := range []string{
		`{"apiVersion":"inference.networking.k8s.io/v1","kind":"InferencePool","metadata":{"name":"llama","namespace":"default"},"spec":{"selector":{"matchLabels":{"app":"vllm-llama"}},"targetPorts":[{"number":8000}],"endpointPickerRef":{"name":"kvmesh-epp","port":{"number":9002},"failureMode":"FailClose"}}}`,
		`{"spec":{"selector":{"matchLabels":{"app":"a","tier":"gpu"}},"targetPorts":[{"number":8000},{"number":8001}]}}`,
		`{"spec":{"selector":{"matchLabels":{}},"targetPorts":[]}}`,
		`{"spec":{"selector":{"matchLabels":{"app":1}},"targetPorts":[{"number":0},{"number":65536},{"number":80.5},{"number":"80"},{},null,3]}}`,
		`{"spec":{"selector":"app=x","targetPorts":{"number":80}}}`,
		`{"spec":null}`,
		`{}`,
		`{"spec":{"selector":{"matchLabels":{"a":"b"}},"targetPorts":[{"number":-1},{"number":9223372036854775807}],"endpointPickerRef":{"name":5}}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var obj map[string]any
		if utiljson.Unmarshal(b, &obj) != nil {
			return
		}
		ps, err := parsePoolSpec(obj)
		if err != nil {
			if !errors.Is(err, ErrBadPool) {
				t.Fatalf("unclear error: %v", err)
			}
			return
		}
		if len(ps.Selector) == 0 || len(ps.TargetPorts) == 0 {
			t.Fatalf("accepted without a selector or ports: %+v", ps)
		}
		// What a plain walk of the object reads (a typed encoding/json
		// decode would match keys case-insensitively, as the API server
		// does not).
		spec, _ := obj["spec"].(map[string]any)
		sel, _ := spec["selector"].(map[string]any)
		ml, _ := sel["matchLabels"].(map[string]any)
		want := map[string]string{}
		for k, v := range ml {
			s, ok := v.(string)
			if !ok {
				t.Fatalf("accepted the non-string label value %v", v)
			}
			want[k] = s
		}
		if !maps.Equal(ps.Selector, want) {
			t.Fatalf("selector %v, want %v", ps.Selector, want)
		}
		tp, _ := spec["targetPorts"].([]any)
		var ports []int
		for _, p := range tp {
			pm, _ := p.(map[string]any)
			n, ok := pm["number"].(int64)
			if !ok {
				t.Fatalf("accepted the port %v", p)
			}
			ports = append(ports, int(n))
		}
		if !slices.Equal(ps.TargetPorts, ports) {
			t.Fatalf("ports %v, want %v", ps.TargetPorts, ports)
		}
		for _, p := range ps.TargetPorts {
			if p < 1 || p > 65535 {
				t.Fatalf("port %d accepted", p)
			}
		}
	})
}
