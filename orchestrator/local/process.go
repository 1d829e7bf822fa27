package local

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os/exec"
	"sync/atomic"
	"syscall"
	"time"
)

// proc is one child process. Its waiter goroutine (started by startProc,
// owned by the proc) reads stdout to EOF, reaps the child and closes done;
// it ends when the child exits, which stop guarantees.
type proc struct {
	name     string
	cmd      *exec.Cmd
	done     chan struct{}
	err      error // the exit error; read only after done
	stopping atomic.Bool
}

// startProc starts exe with args. Every stdout line goes to onLine (from
// the waiter goroutine; it must not block). stderr goes to stderr (nil:
// discarded). exited is signalled, without blocking, when the child exits.
func startProc(name, exe string, args, env []string, stderr io.Writer, onLine func(string), exited chan<- struct{}) (*proc, error) {
	cmd := exec.Command(exe, args...)
	cmd.Env = env
	cmd.Stderr = stderr
	cmd.SysProcAttr = childAttr()
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, done: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if onLine != nil {
				onLine(sc.Text())
			}
		}
		_, _ = io.Copy(io.Discard, out) // a line over the scanner's limit: keep the child unblocked
		p.err = cmd.Wait()
		close(p.done)
		select {
		case exited <- struct{}{}:
		default:
		}
	}()
	return p, nil
}

// pid is the child's process id.
func (p *proc) pid() int { return p.cmd.Process.Pid }

// exitedUnasked reports a child that ended without stop being called.
func (p *proc) exitedUnasked() bool {
	select {
	case <-p.done:
		return !p.stopping.Load()
	default:
		return false
	}
}

// stop sends SIGTERM, waits up to grace (or until ctx ends), then SIGKILL,
// and always waits for the child to be reaped. Safe to call twice.
func (p *proc) stop(ctx context.Context, grace time.Duration) error {
	p.stopping.Store(true)
	select {
	case <-p.done:
		return nil
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
		return nil
	case <-t.C:
	case <-ctx.Done():
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	return fmt.Errorf("%s did not stop within %v: killed", p.name, grace)
}
