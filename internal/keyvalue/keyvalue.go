// Package keyvalue reads the "k=v,k=v" specs of the command lines' engine
// flags (the sidecar's --engine in DaemonSet mode, the ingress's --engine
// key=value form): one reading, so both refuse the same mistakes alike.
package keyvalue

import (
	"fmt"
	"strings"
)

// Pair is one k=v of a spec.
type Pair struct{ Key, Value string }

// Split returns spec's pairs in order. A part that is not key=value (no
// '=', or an empty key) and a key given twice are errors: the last one
// would win silently (model=m,...,model=n served n).
func Split(spec string) ([]Pair, error) {
	parts := strings.Split(spec, ",")
	out := make([]Pair, 0, len(parts))
	for _, kv := range parts {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not key=value", kv)
		}
		for _, p := range out {
			if p.Key == k {
				return nil, fmt.Errorf("%s= given twice", k)
			}
		}
		out = append(out, Pair{k, v})
	}
	return out, nil
}
