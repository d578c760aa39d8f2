package controlplane

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync/atomic"
)

// Process is a local process whose output goes to a log file: a component
// of a control plane (Karmada's) or of the local fleet (a proxy, an
// operator).
type Process struct {
	name, logPath string
	cmd           *exec.Cmd
	// done closes when the process has exited; err is then its exit error.
	done   chan struct{}
	err    error
	killed atomic.Bool
}

// StartProcess starts binary with args, named name in errors, its output
// appended to logPath.
func StartProcess(name, logPath, binary string, args ...string) (*Process, error) {
	// Appended to: a container started again logs on in its file.
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("log of %s: %w", name, err)
	}
	cmd := exec.Command(binary, args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// In its own process group, so that a Ctrl-C in the terminal reaches
	// only ctrlmeshctl, which then stops the fleet in order.
	cmd.SysProcAttr = ownProcessGroup()
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	p := &Process{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		p.err = cmd.Wait()
		logFile.Close()
		close(p.done)
	}()
	return p, nil
}

// Kill kills the process and its process group with SIGKILL, as a crash
// would, and waits until it has exited.
func (p *Process) Kill() {
	p.killed.Store(true)
	select {
	case <-p.done:
		return
	default:
	}
	killProcessGroup(p.cmd.Process)
	<-p.done
}

// Killed tells whether Kill was called.
func (p *Process) Killed() bool { return p.killed.Load() }

// Done closes when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// PID is the process ID.
func (p *Process) PID() int { return p.cmd.Process.Pid }

// ExitError reports the process's end when it ended without being killed.
func (p *Process) ExitError() error {
	select {
	case <-p.done:
		if !p.killed.Load() {
			return fmt.Errorf("%s exited: %v: %s (log: %s)", p.name, p.err, lastLine(p.logPath), p.logPath)
		}
	default:
	}
	return nil
}

// lastLine is the last line of a log, which says why a process exited,
// such as a port in use.
func lastLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimSpace(string(data)), "\n")
	return lines[len(lines)-1]
}

// FreePort returns a TCP port free on 127.0.0.1 now; a process started soon
// after may still lose it to another, and then fails to listen.
func FreePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}
