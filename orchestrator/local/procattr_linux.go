package local

import "syscall"

// childAttr puts a child in its own process group (a terminal's Ctrl-C
// reaches the orchestrator alone, which then stops the children in order)
// and has the kernel kill it if the orchestrator dies without stopping it.
// Pdeathsig fires when the thread that started the child exits; Go keeps
// its threads for the process's life unless a locked goroutine ends, which
// this package never does.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
