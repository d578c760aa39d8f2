package env

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"
)

// Main is the body of a package's TestMain whose tests share one fleet: it
// starts the fleet of opts, hands it to setup, runs the tests, runs the
// cleanup setup returned and stops the fleet. setup's context lasts until
// the tests are done. When the package is being fuzzed, Main starts
// nothing: fuzz targets run alone, in many processes, and need no API
// server. It returns the exit code for os.Exit.
func Main(m *testing.M, opts Options, setup func(ctx context.Context, f *Fleet) (cleanup func(), err error)) int {
	flag.Parse()
	if fuzz := flag.Lookup("test.fuzz"); fuzz != nil && fuzz.Value.String() != "" {
		return m.Run()
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	startCtx, cancelStart := context.WithTimeout(ctx, 4*time.Minute)
	start := time.Now()
	fleet, err := Start(startCtx, opts)
	cancelStart()
	if err != nil {
		fmt.Fprintln(os.Stderr, "starting the fleet:", err)
		return 1
	}
	defer func() {
		if err := fleet.Stop(); err != nil {
			fmt.Fprintln(os.Stderr, "stopping the fleet:", err)
		}
	}()
	fmt.Fprintf(os.Stderr, "fleet serving after %s\n", time.Since(start).Round(time.Millisecond))
	cleanup, err := setup(ctx, fleet)
	if err != nil {
		fmt.Fprintln(os.Stderr, "setting up the tests:", err)
		return 1
	}
	if cleanup != nil {
		defer cleanup()
	}
	return m.Run()
}

// Names hands out names unique within a test binary: the base name the
// first time, base-r<n> after, so that tests also pass with -count above 1
// against one shared fleet (envtest runs no namespace controller, so what a
// test creates cannot be cleaned up).
type Names struct {
	mu   sync.Mutex
	used map[string]int
}

// Unique returns a name not handed out before, made from base.
func (n *Names) Unique(base string) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.used == nil {
		n.used = map[string]int{}
	}
	n.used[base]++
	if c := n.used[base]; c > 1 {
		return fmt.Sprintf("%s-r%d", base, c)
	}
	return base
}
