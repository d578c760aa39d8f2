// Package benchstat holds what the benchmark commands under test/bench
// share: latency summaries with nearest-rank percentiles, ratios and rates,
// goal verdicts, and the commands' main.
package benchstat

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"slices"
	"syscall"
	"time"
)

// Summary describes a set of latency samples.
type Summary struct {
	N                        int
	Mean, P50, P99, Min, Max time.Duration
}

// Summarize computes the Summary of samples; it does not modify them.
func Summarize(samples []time.Duration) Summary {
	if len(samples) == 0 {
		return Summary{}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var total time.Duration
	for _, s := range sorted {
		total += s
	}
	return Summary{
		N:    len(sorted),
		Mean: total / time.Duration(len(sorted)),
		P50:  Percentile(sorted, 0.50),
		P99:  Percentile(sorted, 0.99),
		Min:  sorted[0],
		Max:  sorted[len(sorted)-1],
	}
}

// Percentile is the nearest-rank Percentile of sorted samples: the smallest
// sample such that at least q of all samples are at or below it. q is clamped
// to [0, 1]; q = 0 gives the minimum. No samples give 0.
func Percentile(sorted []time.Duration, q float64) time.Duration {
	n := len(sorted)
	if n == 0 {
		return 0
	}
	q = math.Min(math.Max(q, 0), 1)
	rank := int(math.Ceil(q * float64(n)))
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// Ratio is a/b, NaN when b is zero.
func Ratio(a, b time.Duration) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// PerSecond is how many of count happen per second over d, NaN when d is zero.
func PerSecond(count int, d time.Duration) float64 {
	if d <= 0 {
		return math.NaN()
	}
	return float64(count) / d.Seconds()
}

// Verdict is PASS when ok, else MISS.
func Verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}

// Main runs a benchmark command: parse reads the flags (-h prints the usage
// and exits 0; a flag error exits 2), run measures and reports to stdout,
// progress to stderr, until done or interrupted (an error exits 1).
func Main[O any](name string, parse func(args []string, output io.Writer) (O, error), run func(ctx context.Context, opts O, stdout, stderr io.Writer) error) {
	opts, err := parse(os.Args[1:], os.Stderr)
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		_, _ = fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err = run(ctx, opts, os.Stdout, os.Stderr)
	stop()
	if err != nil {
		_, _ = fmt.Fprintln(os.Stderr, name+":", err)
		os.Exit(1)
	}
}
