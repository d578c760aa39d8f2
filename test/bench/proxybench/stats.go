package main

import (
	"math"
	"slices"
	"time"
)

// summary describes a set of latency samples.
type summary struct {
	N                        int
	Mean, P50, P99, Min, Max time.Duration
}

// summarize computes the summary of samples; it does not modify them.
func summarize(samples []time.Duration) summary {
	if len(samples) == 0 {
		return summary{}
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	var total time.Duration
	for _, s := range sorted {
		total += s
	}
	return summary{
		N:    len(sorted),
		Mean: total / time.Duration(len(sorted)),
		P50:  percentile(sorted, 0.50),
		P99:  percentile(sorted, 0.99),
		Min:  sorted[0],
		Max:  sorted[len(sorted)-1],
	}
}

// percentile is the nearest-rank percentile of sorted samples: the smallest
// sample such that at least q of all samples are at or below it. q is clamped
// to [0, 1]; q = 0 gives the minimum. No samples give 0.
func percentile(sorted []time.Duration, q float64) time.Duration {
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

// ratio is a/b, NaN when b is zero.
func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return math.NaN()
	}
	return float64(a) / float64(b)
}

// perSecond is how many of count happen per second over d, NaN when d is zero.
func perSecond(count int, d time.Duration) float64 {
	if d <= 0 {
		return math.NaN()
	}
	return float64(count) / d.Seconds()
}

// verdict is PASS when ok, else MISS.
func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}
