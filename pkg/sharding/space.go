// Package sharding owns ctrlmesh's shard membership math. A namespace falls
// into a bucket: the top log2(N) bits of the 64-bit FNV-1a hash of its name.
// Buckets map to hash ranges (for KEP-5866 server-side sharded list and watch)
// and to label values (for label-selector sharding). The labeler, the proxy
// and the hub all call this package, so they cannot disagree.
//
// The hash is the one kube-apiserver computes for
// shardRange(object.metadata.namespace, …): FNV-1a, 64 bits, over the bytes of
// the namespace name. A bucket is therefore a contiguous hash range, and a set
// of buckets a union of ranges.
package sharding

import (
	"fmt"
	"hash/fnv"
	"math/bits"
)

const (
	// DefaultBuckets is the bucket count when a ShardingConfig names none.
	DefaultBuckets = 32
	// MaxBuckets bounds the bucket count; the API enforces the same bound.
	MaxBuckets = 4096
)

// Hash is the 64-bit FNV-1a hash of a namespace name.
func Hash(namespace string) uint64 {
	h := fnv.New64a()
	// hash.Hash.Write never returns an error.
	_, _ = h.Write([]byte(namespace))
	return h.Sum64()
}

// Space is the hash space of namespaces cut into buckets: a bucket count, a
// power of two from 1 to MaxBuckets. (A "scheme" in ctrlmesh is only ever a
// runtime.Scheme; see pkg/scheme.)
type Space struct {
	buckets int
	// bits is log2(buckets): how many top bits of the hash make the bucket.
	bits uint
}

// NewSpace returns the space for a bucket count, or an error saying why the
// count is not one.
func NewSpace(buckets int) (Space, error) {
	if buckets < 1 || buckets > MaxBuckets || buckets&(buckets-1) != 0 {
		return Space{}, fmt.Errorf("bucket count must be a power of two from 1 to %d, got %d", MaxBuckets, buckets)
	}
	return Space{buckets: buckets, bits: uint(bits.TrailingZeros(uint(buckets)))}, nil
}

// MustSpace is NewSpace for counts known to be valid, such as constants.
func MustSpace(buckets int) Space {
	s, err := NewSpace(buckets)
	if err != nil {
		panic(err)
	}
	return s
}

// Buckets is the number of buckets.
func (s Space) Buckets() int { return s.buckets }

// Bucket is the bucket a namespace falls into.
func (s Space) Bucket(namespace string) int {
	return s.bucketOfHash(Hash(namespace))
}

func (s Space) bucketOfHash(h uint64) int {
	if s.bits == 0 {
		return 0
	}
	return int(h >> (64 - s.bits))
}

// HashRange is a range of 64-bit hash values, both ends included. Inclusive
// ends let the whole space [0, 2^64) be written in uint64.
type HashRange struct {
	First, Last uint64
}

// Contains reports whether h lies in the range.
func (r HashRange) Contains(h uint64) bool { return h >= r.First && h <= r.Last }

// Range is the hash range of one bucket: [b·2^(64−k), (b+1)·2^(64−k)).
func (s Space) Range(bucket int) HashRange {
	return s.runRange(bucket, bucket)
}

// runRange is the hash range of the consecutive buckets first..last.
func (s Space) runRange(first, last int) HashRange {
	shift := 64 - s.bits
	// Shifts of 64 yield 0 in Go, and (N << shift) - 1 wraps to MaxUint64 for
	// the last bucket, so the top of the space needs no special case.
	return HashRange{
		First: uint64(first) << shift,
		Last:  (uint64(last+1) << shift) - 1,
	}
}
