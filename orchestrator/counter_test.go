package orchestrator

import (
	"net/http"
	"strings"
	"sync"
)

// requestCounter counts a client's requests by method and path.
type requestCounter struct {
	mu sync.Mutex
	n  map[string]int // "METHOD path"
}

func (c *requestCounter) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		c.mu.Lock()
		if c.n == nil {
			c.n = map[string]int{}
		}
		c.n[req.Method+" "+req.URL.Path]++
		c.mu.Unlock()
		return rt.RoundTrip(req)
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// snapshot is a copy of the counts so far.
func (c *requestCounter) snapshot() *requestCounter {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := make(map[string]int, len(c.n))
	for k, v := range c.n {
		n[k] = v
	}
	return &requestCounter{n: n}
}

// count sums the requests of method whose path ends with suffix.
func (c *requestCounter) count(method, suffix string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	total := 0
	for k, v := range c.n {
		m, p, _ := strings.Cut(k, " ")
		if m == method && strings.HasSuffix(p, suffix) {
			total += v
		}
	}
	return total
}
