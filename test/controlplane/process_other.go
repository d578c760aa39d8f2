//go:build !unix

package controlplane

import (
	"os"
	"syscall"
)

func ownProcessGroup() *syscall.SysProcAttr { return nil }

func killProcessGroup(p *os.Process) {
	// An error means it is gone already.
	_ = p.Kill()
}
