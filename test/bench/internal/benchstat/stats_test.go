package benchstat

import (
	"math"
	"slices"
	"testing"
	"time"
)

func ms(v ...int) []time.Duration {
	out := make([]time.Duration, len(v))
	for i, x := range v {
		out[i] = time.Duration(x) * time.Millisecond
	}
	return out
}

func oneToHundred() []time.Duration {
	v := make([]int, 100)
	for i := range v {
		v[i] = 100 - i // descending: Summarize must sort
	}
	return ms(v...)
}

func TestPercentile(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []time.Duration // sorted
		q       float64
		want    time.Duration
	}{
		{"empty", nil, 0.5, 0},
		{"single p50", ms(7), 0.5, 7 * time.Millisecond},
		{"single p99", ms(7), 0.99, 7 * time.Millisecond},
		{"q=0 is the minimum", ms(1, 2, 3), 0, time.Millisecond},
		{"q=1 is the maximum", ms(1, 2, 3), 1, 3 * time.Millisecond},
		{"q below 0 clamps", ms(1, 2, 3), -1, time.Millisecond},
		{"q above 1 clamps", ms(1, 2, 3), 2, 3 * time.Millisecond},
		{"even count p50 is the lower middle", ms(1, 2, 3, 4), 0.5, 2 * time.Millisecond},
		{"odd count p50 is the middle", ms(1, 2, 3, 4, 5), 0.5, 3 * time.Millisecond},
		{"p99 of 1..100", ms(func() []int {
			v := make([]int, 100)
			for i := range v {
				v[i] = i + 1
			}
			return v
		}()...), 0.99, 99 * time.Millisecond},
		{"p99 of 10 samples is the maximum", ms(1, 2, 3, 4, 5, 6, 7, 8, 9, 10), 0.99, 10 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Percentile(tc.samples, tc.q); got != tc.want {
				t.Errorf("Percentile(%v, %v) = %v, want %v", tc.samples, tc.q, got, tc.want)
			}
		})
	}
}

func TestSummarize(t *testing.T) {
	for _, tc := range []struct {
		name    string
		samples []time.Duration
		want    Summary
	}{
		{"empty", nil, Summary{}},
		{"single", ms(5), Summary{N: 1, Mean: 5 * time.Millisecond, P50: 5 * time.Millisecond, P99: 5 * time.Millisecond, Min: 5 * time.Millisecond, Max: 5 * time.Millisecond}},
		{"unsorted with an outlier", ms(3, 1, 2, 100), Summary{N: 4, Mean: 26500 * time.Microsecond, P50: 2 * time.Millisecond, P99: 100 * time.Millisecond, Min: time.Millisecond, Max: 100 * time.Millisecond}},
		{"1..100 descending", oneToHundred(), Summary{N: 100, Mean: 50500 * time.Microsecond, P50: 50 * time.Millisecond, P99: 99 * time.Millisecond, Min: time.Millisecond, Max: 100 * time.Millisecond}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := slices.Clone(tc.samples)
			if got := Summarize(in); got != tc.want {
				t.Errorf("Summarize(%v) = %+v, want %+v", tc.samples, got, tc.want)
			}
			if !slices.Equal(in, tc.samples) {
				t.Errorf("Summarize modified its input: %v, was %v", in, tc.samples)
			}
		})
	}
}

func TestRatioAndRate(t *testing.T) {
	for _, tc := range []struct {
		name string
		got  float64
		want float64 // NaN: want NaN
	}{
		{"Ratio", Ratio(3*time.Millisecond, 2*time.Millisecond), 1.5},
		{"Ratio by zero", Ratio(time.Millisecond, 0), math.NaN()},
		{"rate", PerSecond(5000, 2*time.Second), 2500},
		{"rate over zero", PerSecond(10, 0), math.NaN()},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if math.IsNaN(tc.want) != math.IsNaN(tc.got) || (!math.IsNaN(tc.want) && math.Abs(tc.got-tc.want) > 1e-9) {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
	if Verdict(true) != "PASS" || Verdict(false) != "MISS" {
		t.Errorf("Verdict: got %q/%q", Verdict(true), Verdict(false))
	}
}
