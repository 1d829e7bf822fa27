package testutil

import (
	"context"
	"errors"
	"fmt"
	"testing"
)

// RetryLost tries again after a request's own deadline passed, and returns
// any other outcome (success, an error, the caller's deadline) at once.
func TestRetryLost(t *testing.T) {
	lost := fmt.Errorf("create stream: %w", context.DeadlineExceeded)
	calls := 0
	err := RetryLost(context.Background(), func(ctx context.Context) error {
		if _, ok := ctx.Deadline(); !ok {
			t.Fatal("a try has no deadline of its own")
		}
		if calls++; calls < 3 {
			return lost
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("lost twice then answered: err %v after %d tries, want nil after 3", err, calls)
	}

	refused := errors.New("insufficient resources")
	calls = 0
	if err := RetryLost(context.Background(), func(context.Context) error { calls++; return refused }); err != refused || calls != 1 {
		t.Fatalf("refused: err %v after %d tries, want the refusal after 1", err, calls)
	}

	ctx, cancel := context.WithCancel(context.Background())
	calls = 0
	err = RetryLost(ctx, func(context.Context) error { calls++; cancel(); return lost })
	if !errors.Is(err, context.DeadlineExceeded) || calls != 1 {
		t.Fatalf("caller's context ended: err %v after %d tries, want the timeout after 1", err, calls)
	}
}
