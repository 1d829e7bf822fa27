package manifests

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"go.yaml.in/yaml/v3"
)

// TestSidecarStreamReplicasMatchNATS: the sidecars of the shipped overlays
// give the delta stream and the tokenizer store as many replicas as the
// NATS StatefulSet has servers, so both survive losing one (base/nats.yaml's
// promise) instead of taking a fallback.
func TestSidecarStreamReplicasMatchNATS(t *testing.T) {
	servers := 0
	eachDoc(t, filepath.Join("base", "nats.yaml"), func(doc map[string]any) {
		if doc["kind"] == "StatefulSet" && dig(doc, "metadata", "name") == "nats" {
			servers, _ = dig(doc, "spec", "replicas").(int)
		}
	})
	if servers < 3 {
		t.Fatalf("the NATS StatefulSet has %d servers; the install promises a stream that survives losing one", servers)
	}
	want := "--stream-replicas=" + strconv.Itoa(servers)
	for _, f := range []string{"overlays/sidecar-container/vllm.yaml", "overlays/daemonset/sidecar-daemonset.yaml"} {
		found := 0
		eachDoc(t, f, func(doc map[string]any) {
			walk(doc, func(args []any) {
				if len(args) > 0 && args[0] == "sidecar" {
					found++
					if !slices.Contains(args, any(want)) {
						t.Errorf("%s: the sidecar's args %v lack %s (the NATS StatefulSet's size)", f, args, want)
					}
				}
			})
		})
		if found == 0 {
			t.Errorf("%s: no sidecar container", f)
		}
	}
}

func eachDoc(t *testing.T, path string, fn func(map[string]any)) {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	dec := yaml.NewDecoder(bytesReader(b))
	for {
		var doc map[string]any
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			return
		} else if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		fn(doc)
	}
}

func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

// walk calls fn with every "args" list under v.
func walk(v any, fn func([]any)) {
	switch x := v.(type) {
	case map[string]any:
		for k, c := range x {
			if l, ok := c.([]any); ok && k == "args" {
				fn(l)
			}
			walk(c, fn)
		}
	case []any:
		for _, c := range x {
			walk(c, fn)
		}
	}
}
