package testutil

import (
	"context"
	"testing"
	"time"
)

// StopTimeout bounds how long Run's cleanup waits for run to return.
const StopTimeout = 30 * time.Second

// Running is a goroutine Run started: Done is closed when it returned,
// and Err is then what it returned.
type Running struct {
	done chan struct{}
	err  error
}

// Done is closed once run returned.
func (r *Running) Done() <-chan struct{} { return r.done }

// Err is run's result; valid once Done is closed.
func (r *Running) Err() error { return r.err }

// Run runs run(ctx) in a goroutine owned by the test: its cleanup cancels
// ctx and waits up to StopTimeout for run to return, failing t when run
// returned an error (named by what, with detail() after it when detail is
// set) or did not stop.
func Run(t testing.TB, what string, run func(ctx context.Context) error, detail func() string) *Running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &Running{done: make(chan struct{})}
	go func() {
		defer close(r.done)
		r.err = run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-r.done:
			if r.err != nil {
				msg := ""
				if detail != nil {
					msg = "\n" + detail()
				}
				t.Errorf("%s: %v%s", what, r.err, msg)
			}
		case <-time.After(StopTimeout):
			t.Errorf("%s did not stop", what)
		}
	})
	return r
}
