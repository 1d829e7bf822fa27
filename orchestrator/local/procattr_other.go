//go:build !linux

package local

import "syscall"

// childAttr puts a child in its own process group; without Linux's
// Pdeathsig a killed orchestrator can leave children behind.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
