package des

import (
	"context"
	"fmt"
	"runtime"
	"sync"
)

// eachPolicy runs one for every policy, at most par at a time (0:
// GOMAXPROCS), and stops starting new ones once ctx is done. store receives
// each result under a lock. It returns one's first error, else ctx's. Run
// and RunPD share it.
func eachPolicy[R any](ctx context.Context, policies []string, par int, one func(p string) (R, error), store func(p string, r R)) error {
	if par == 0 {
		par = runtime.GOMAXPROCS(0)
	}
	var (
		mu   sync.Mutex
		wg   sync.WaitGroup
		sem  = make(chan struct{}, par)
		ferr error
	)
	for _, p := range policies {
		if ctx.Err() != nil {
			break
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			r, err := one(p)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && ferr == nil {
				ferr = err
			}
			store(p, r)
		}()
	}
	wg.Wait()
	if ferr != nil {
		return ferr
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("des: %w", err)
	}
	return nil
}
