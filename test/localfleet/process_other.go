//go:build !unix

package localfleet

import (
	"os"
	"syscall"
)

func ownProcessGroup() *syscall.SysProcAttr { return nil }

func killProcessGroup(p *os.Process) {
	// An error means it is gone already.
	_ = p.Kill()
}
