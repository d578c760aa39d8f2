package main

import (
	"fmt"
	"math"
	"slices"
	"time"
)

// percentile is the nearest-rank percentile of samples: the smallest sample
// such that at least q of all samples are at or below it. With fewer than
// 100 samples, p99 is therefore the maximum. No samples give 0.
func percentile(samples []time.Duration, q float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	sorted := slices.Clone(samples)
	slices.Sort(sorted)
	rank := int(math.Ceil(math.Min(math.Max(q, 0), 1) * float64(len(sorted))))
	return sorted[max(rank, 1)-1]
}

// fmtMs prints a duration in milliseconds, or seconds from 10 s up.
func fmtMs(d time.Duration) string {
	if d >= 10*time.Second {
		return fmt.Sprintf("%.2f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

// verdict is PASS when ok, else MISS.
func verdict(ok bool) string {
	if ok {
		return "PASS"
	}
	return "MISS"
}
