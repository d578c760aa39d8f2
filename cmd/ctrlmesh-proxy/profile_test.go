package main

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ctrlmesh/ctrlmesh/proxy"
)

// burnCPU spins until this process has used d more CPU time (user and
// system), so that the profiler has samples whatever the machine's load.
func burnCPU(t *testing.T, d time.Duration) {
	t.Helper()
	used := func() time.Duration {
		var ru syscall.Rusage
		if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
			t.Fatal(err)
		}
		return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	start, deadline := used(), time.Now().Add(time.Minute)
	x := uint64(1)
	for used()-start < d {
		for range 1 << 16 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		if time.Now().After(deadline) {
			t.Fatalf("not %s of CPU time within a minute", d)
		}
	}
	if x == 0 {
		t.Log(x) // keeps the loop from being optimised away
	}
}

// TestCPUProfile: --cpu-profile writes a pprof CPU profile of the run,
// complete once the proxy returns, in which the run's work shows; a file
// that cannot be created fails the command before the proxy runs. Without
// the flag no profile is taken (pprof allows one profiler per process:
// starting another would fail).
func TestCPUProfile(t *testing.T) {
	member := writeKubeconfig(t, t.TempDir(), "member", "https://member.example:6443")
	base := []string{"--upstream-kubeconfig", member, "--pod-name", "p", "--pod-namespace", "ops", "--rules-name", "demo"}
	path := filepath.Join(t.TempDir(), "proxy.pprof")
	cmd := newCommand(func(context.Context, proxy.Options) error {
		burnCPU(t, 300*time.Millisecond)
		return nil
	})
	if err := cmd.execute(context.Background(), append(base, "--cpu-profile", path), &strings.Builder{}, &strings.Builder{}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(bytes.NewReader(data))
	if err != nil {
		t.Fatalf("the profile is not gzip-compressed, as pprof writes it: %v", err)
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		t.Fatal(err)
	}
	// The profile's string table names the sampled functions.
	if !bytes.Contains(raw, []byte("burnCPU")) {
		t.Errorf("the profile (%d bytes) has no sample of the run's work (burnCPU)", len(raw))
	}

	ran := false
	cmd = newCommand(func(context.Context, proxy.Options) error { ran = true; return nil })
	err = cmd.execute(context.Background(), append(base, "--cpu-profile", filepath.Join(t.TempDir(), "missing", "proxy.pprof")), &strings.Builder{}, &strings.Builder{})
	if err == nil || !strings.Contains(err.Error(), "--cpu-profile") || ran {
		t.Errorf("an unwritable profile: error %v, proxy ran %v; want an error naming --cpu-profile and no run", err, ran)
	}

	// Without the flag the proxy runs unprofiled: the profiler is free.
	cmd = newCommand(func(context.Context, proxy.Options) error { return isProfiling() })
	if err := cmd.execute(context.Background(), base, &strings.Builder{}, &strings.Builder{}); err != nil {
		t.Errorf("without --cpu-profile: %v", err)
	}
}

// isProfiling fails when the CPU profiler is already running.
func isProfiling() error {
	if err := pprof.StartCPUProfile(io.Discard); err != nil {
		return errors.New("the CPU profiler runs: " + err.Error())
	}
	pprof.StopCPUProfile()
	return nil
}
