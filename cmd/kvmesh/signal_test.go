package main

import (
	"context"
	"io"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The first signal cancels the command's context (it drains); a second
// one exits at once with status 1 and a line saying so.
func TestSecondSignalForcesExit(t *testing.T) {
	ch := make(chan os.Signal, 2)
	done := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	forced := make(chan os.Signal, 1)
	go watchSignals(ch, done, cancel, func(s os.Signal) { forced <- s })
	ch <- syscall.SIGTERM
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the first signal did not cancel")
	}
	select {
	case s := <-forced:
		t.Fatalf("forced on the first signal (%v)", s)
	default:
	}
	ch <- os.Interrupt
	select {
	case s := <-forced:
		if s != os.Interrupt {
			t.Fatalf("forced by %v", s)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the second signal did not force an exit")
	}
	close(done)

	// signalContext wires it to the process's signals and the exit status;
	// stop ends the watch (no exit after it).
	var errOut testutil.SyncBuffer
	code := make(chan int, 1)
	sctx, stop := signalContext(&errOut, "ingress", []string{"--log-format", "text"}, func(c int) { code <- c })
	for range 2 {
		if err := syscall.Kill(os.Getpid(), syscall.SIGINT); err != nil {
			t.Fatal(err)
		}
		if sctx.Err() == nil {
			<-sctx.Done() // the first signal's cancel; the second is then queued for the watch
		}
	}
	select {
	case c := <-code:
		if c != 1 || !strings.Contains(errOut.String(), "kvmesh ingress: second signal (interrupt) while draining: exiting now") {
			t.Fatalf("exit %d, stderr %q", c, errOut.String())
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no forced exit")
	}
	stop()
}

// SIGHUP drains as SIGTERM does: its default action ended the process at
// once, cutting every stream in flight with no error event.
func TestHangupDrains(t *testing.T) {
	code := make(chan int, 1)
	ctx, stop := signalContext(io.Discard, "ingress", nil, func(c int) { code <- c })
	defer stop()
	if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
		t.Fatal(err)
	}
	select {
	case <-ctx.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("SIGHUP did not start the drain")
	}
	select {
	case c := <-code:
		t.Fatalf("one SIGHUP forced an exit (%d)", c)
	default:
	}
}
