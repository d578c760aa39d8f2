//go:build unix

package controlplane

import (
	"os"
	"syscall"
)

func ownProcessGroup() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setpgid: true} }

func killProcessGroup(p *os.Process) {
	// The group's id is the leader's pid. An error means it is gone already.
	_ = syscall.Kill(-p.Pid, syscall.SIGKILL)
}
