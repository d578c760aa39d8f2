package sharding

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/bits-and-blooms/bitset"
)

// Set is a set of buckets of one Space. The zero Set is not usable; make
// one with Space.NewSet or Space.ParseSet.
type Set struct {
	space Space
	bits  *bitset.BitSet
}

// NewSet returns the set of the given buckets. A bucket outside the space is
// an error.
func (s Space) NewSet(buckets ...int) (Set, error) {
	set := Set{space: s, bits: bitset.New(uint(s.buckets))}
	for _, b := range buckets {
		if err := s.check(b); err != nil {
			return Set{}, err
		}
		set.bits.Set(uint(b))
	}
	return set, nil
}

// AllBuckets is the set of every bucket of the space.
func (s Space) AllBuckets() Set {
	set := Set{space: s, bits: bitset.New(uint(s.buckets))}
	set.bits.FlipRange(0, uint(s.buckets))
	return set
}

func (s Space) check(bucket int) error {
	if bucket < 0 || bucket >= s.buckets {
		return fmt.Errorf("bucket %d is out of range: with %d buckets they are numbered 0 to %d", bucket, s.buckets, s.buckets-1)
	}
	return nil
}

// Space is the space the set belongs to.
func (set Set) Space() Space { return set.space }

// Has reports whether the bucket is in the set.
func (set Set) Has(bucket int) bool {
	return bucket >= 0 && set.bits.Test(uint(bucket))
}

// HasNamespace reports whether the namespace's bucket is in the set.
func (set Set) HasNamespace(namespace string) bool {
	return set.Has(set.space.Bucket(namespace))
}

// Len is the number of buckets in the set.
func (set Set) Len() int { return int(set.bits.Count()) }

// IsEmpty reports whether the set has no bucket.
func (set Set) IsEmpty() bool { return set.bits.None() }

// Equal reports whether both sets hold the same buckets of the same space.
func (set Set) Equal(other Set) bool {
	return set.space == other.space && set.bits.Equal(other.bits)
}

// Buckets lists the buckets in increasing order.
func (set Set) Buckets() []int {
	out := make([]int, 0, set.Len())
	for b, ok := set.bits.NextSet(0); ok; b, ok = set.bits.NextSet(b + 1) {
		out = append(out, int(b))
	}
	return out
}

// Union is the set of buckets in either set.
func (set Set) Union(other Set) Set {
	set.mustMatch(other)
	return Set{space: set.space, bits: set.bits.Union(other.bits)}
}

// Intersection is the set of buckets in both sets.
func (set Set) Intersection(other Set) Set {
	set.mustMatch(other)
	return Set{space: set.space, bits: set.bits.Intersection(other.bits)}
}

// Difference is the set of buckets in set and not in other.
func (set Set) Difference(other Set) Set {
	set.mustMatch(other)
	return Set{space: set.space, bits: set.bits.Difference(other.bits)}
}

// mustMatch guards the set algebra: sets of different bucket counts number
// different hash ranges, so combining them is a programming error.
func (set Set) mustMatch(other Set) {
	if set.space != other.space {
		panic(fmt.Sprintf("sharding: combining sets of %d and %d buckets", set.space.buckets, other.space.buckets))
	}
}

// run is a maximal stretch of consecutive buckets in a set.
type run struct{ first, last int }

func (set Set) runs() []run {
	var out []run
	for b, ok := set.bits.NextSet(0); ok; {
		end, more := set.bits.NextClear(b)
		if !more || end > uint(set.space.buckets) {
			end = uint(set.space.buckets)
		}
		out = append(out, run{first: int(b), last: int(end) - 1})
		b, ok = set.bits.NextSet(end)
	}
	return out
}

// String prints the set in compact notation: increasing, comma-separated
// buckets and inclusive ranges of two or more, such as "0-7,12". The empty set
// prints as "".
func (set Set) String() string {
	var sb strings.Builder
	for i, r := range set.runs() {
		if i > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(strconv.Itoa(r.first))
		if r.last > r.first {
			sb.WriteByte('-')
			sb.WriteString(strconv.Itoa(r.last))
		}
	}
	return sb.String()
}

// ParseSet reads compact notation ("0-7,12"; "" is the empty set). Items may
// overlap and come in any order; spaces around items are ignored. Errors name
// the item at fault.
func (s Space) ParseSet(text string) (Set, error) {
	set, err := s.NewSet()
	if err != nil {
		return Set{}, err
	}
	if strings.TrimSpace(text) == "" {
		return set, nil
	}
	for i, item := range strings.Split(text, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			return Set{}, fmt.Errorf("bucket set %q: item %d is empty", text, i+1)
		}
		lo, hi, isRange := strings.Cut(item, "-")
		first, err := s.parseBucket(text, lo)
		if err != nil {
			return Set{}, err
		}
		last := first
		if isRange {
			if last, err = s.parseBucket(text, hi); err != nil {
				return Set{}, err
			}
			if last < first {
				return Set{}, fmt.Errorf("bucket set %q: range %q runs backwards; write it low to high, as %d-%d", text, item, last, first)
			}
		}
		for b := first; b <= last; b++ {
			set.bits.Set(uint(b))
		}
	}
	return set, nil
}

func (s Space) parseBucket(text, field string) (int, error) {
	field = strings.TrimSpace(field)
	// Digits only: strconv.Atoi would also take signs.
	if field == "" || strings.TrimLeft(field, "0123456789") != "" || len(field) > 5 {
		return 0, fmt.Errorf("bucket set %q: %q is not a bucket number", text, field)
	}
	b, err := strconv.Atoi(field)
	if err != nil {
		return 0, fmt.Errorf("bucket set %q: %q is not a bucket number", text, field)
	}
	if err := s.check(b); err != nil {
		return 0, fmt.Errorf("bucket set %q: %w", text, err)
	}
	return b, nil
}
