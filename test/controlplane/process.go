package controlplane

import (
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// errKilled: the process was killed before a restart.
var errKilled = errors.New("killed")

// restartDelay is how long a restarting process stays down after it
// exited, as a kubelet's first back-off (shorter: tests wait for it).
const restartDelay = time.Second

// Process is a local process whose output goes to a log file: a component
// of a control plane (Karmada's) or of the local fleet (a proxy, an
// operator). With restart, it runs again whenever it exits on its own, as a
// kubelet runs a container of restartPolicy Always again.
type Process struct {
	name, logPath, binary string
	args                  []string
	restart               bool

	mu sync.Mutex
	// cmd is the current run.
	cmd *exec.Cmd
	// restarted counts the runs after the first.
	restarted int
	// done closes when the process has exited for good; err is then its
	// exit error.
	done   chan struct{}
	err    error
	killed atomic.Bool
	// stop closes on kill, ending a restart's wait.
	stop chan struct{}
}

// StartProcess starts binary with args, named name in errors, its output
// appended to logPath; with restart it runs again whenever it exits on its
// own.
func StartProcess(name, logPath string, restart bool, binary string, args ...string) (*Process, error) {
	p := &Process{name: name, logPath: logPath, binary: binary, args: args, restart: restart,
		done: make(chan struct{}), stop: make(chan struct{})}
	cmd, logFile, err := p.start()
	if err != nil {
		return nil, err
	}
	go p.supervise(cmd, logFile)
	return p, nil
}

// start runs the process once, appending to its log.
func (p *Process) start() (*exec.Cmd, *os.File, error) {
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("log of %s: %w", p.name, err)
	}
	cmd := exec.Command(p.binary, p.args...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// In its own process group, so that a Ctrl-C in the terminal reaches
	// only ctrlmeshctl, which then stops the fleet in order.
	cmd.SysProcAttr = ownProcessGroup()
	// Under the lock, so that kill either sees this run or stops it from
	// starting.
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.killed.Load() {
		logFile.Close()
		return nil, nil, errKilled
	}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, nil, fmt.Errorf("starting %s: %w", p.name, err)
	}
	p.cmd = cmd
	return cmd, logFile, nil
}

// supervise waits for each run to end and, with restart, starts the next
// unless the process was killed.
func (p *Process) supervise(cmd *exec.Cmd, logFile *os.File) {
	defer close(p.done)
	for {
		err := cmd.Wait()
		logFile.Close()
		if !p.restart || p.killed.Load() {
			p.err = err
			return
		}
		select {
		case <-p.stop:
			p.err = err
			return
		case <-time.After(restartDelay):
		}
		next, nextLog, startErr := p.start()
		if startErr != nil {
			if !errors.Is(startErr, errKilled) {
				p.err = startErr
			} else {
				p.err = err
			}
			return
		}
		cmd, logFile = next, nextLog
		p.mu.Lock()
		p.restarted++
		p.mu.Unlock()
	}
}

// PID is the process ID of the current run.
func (p *Process) PID() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Restarts counts how often the process ran again after exiting.
func (p *Process) Restarts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.restarted
}

// Kill kills the process and its process group with SIGKILL, as a crash
// would, and waits until it has exited; it is not restarted.
func (p *Process) Kill() {
	p.mu.Lock()
	if !p.killed.Swap(true) {
		close(p.stop)
	}
	cmd := p.cmd
	p.mu.Unlock()
	select {
	case <-p.done:
		return
	default:
	}
	killProcessGroup(cmd.Process)
	<-p.done
}

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
