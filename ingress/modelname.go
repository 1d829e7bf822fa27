package ingress

import "sync/atomic"

// modelNames interns the model names requests asked for and got routed
// with (engines' models, adapters, routes): a request naming one again
// takes the interned string instead of allocating a copy of its bytes. It
// is copy-on-write: a lookup is one atomic load and a map read; a new name
// copies the map, once per name. Only names routed to a live engine are
// added (bounded by the deployment, never by clients), and at most
// maxModelNames.
type modelNames struct {
	m atomic.Pointer[map[string]string]
}

// maxModelNames bounds the interned names.
const maxModelNames = 4096

// name returns b as a string: the interned one when b was added, else a
// copy.
func (n *modelNames) name(b []byte) string {
	if m := n.m.Load(); m != nil {
		if s, ok := (*m)[string(b)]; ok {
			return s
		}
	}
	return string(b)
}

// add interns name.
func (n *modelNames) add(name string) {
	for {
		old := n.m.Load()
		size := 0
		if old != nil {
			if _, ok := (*old)[name]; ok {
				return
			}
			size = len(*old)
		}
		if size >= maxModelNames {
			return
		}
		m := make(map[string]string, size+1)
		if old != nil {
			for k, v := range *old {
				m[k] = v
			}
		}
		m[name] = name
		if n.m.CompareAndSwap(old, &m) {
			return
		}
	}
}
