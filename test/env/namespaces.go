package env

import (
	"fmt"
	"slices"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// SpreadNamespaces returns n namespace names, the given ones first, then
// names <prefix>-<number> picked so that the buckets of space hold counts
// as even as the given names allow (no bucket gets a second name before
// every bucket has one, and so on), with the count of each bucket. Up to
// space.Buckets() names, each is in a bucket of its own.
//
// Picking by bucket is needed: names that differ only in their last bytes,
// such as ns-01 and ns-02, share their bucket, because the hash's top bits
// barely depend on them.
func SpreadNamespaces(space sharding.Space, prefix string, given []string, n int) ([]string, []int) {
	count := make([]int, space.Buckets())
	out := slices.Clone(given)
	for _, name := range given {
		count[space.Bucket(name)]++
	}
	level := slices.Min(count)
	for i := 0; len(out) < n; i++ {
		name := fmt.Sprintf("%s-%05d", prefix, i)
		b := space.Bucket(name)
		if count[b] != level {
			continue
		}
		count[b]++
		out = append(out, name)
		if slices.Min(count) > level {
			level++
		}
	}
	return out, count
}
