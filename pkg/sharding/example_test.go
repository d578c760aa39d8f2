package sharding_test

import (
	"fmt"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

func ExampleSet_ShardSelector() {
	set, err := sharding.MustSpace(32).ParseSet("0-7,12")
	if err != nil {
		panic(err)
	}
	sel, err := set.ShardSelector()
	if err != nil {
		panic(err)
	}
	fmt.Println(sel)
	// Output: shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000') || shardRange(object.metadata.namespace, '0x6000000000000000', '0x6800000000000000')
}

// Names that differ only in their last characters share few buckets: FNV-1a's
// top bits hardly depend on the last bytes. docs/design.md quotes these
// figures.
func ExampleSpace_Bucket_spread() {
	spread := func(buckets, count int, format string) int {
		s := sharding.MustSpace(buckets)
		used := map[int]bool{}
		for i := 0; i < count; i++ {
			used[s.Bucket(fmt.Sprintf(format, i))] = true
		}
		return len(used)
	}
	fmt.Println("tenant-00..63 over 32 buckets:", spread(32, 64, "tenant-%02d"))
	fmt.Println("tenant-000..255 over 32 buckets:", spread(32, 256, "tenant-%03d"))
	fmt.Println("tenant-000..255 over 4096 buckets:", spread(4096, 256, "tenant-%03d"))
	fmt.Println("team-0..63-prod over 32 buckets:", spread(32, 64, "team-%d-prod"))
	// Output:
	// tenant-00..63 over 32 buckets: 1
	// tenant-000..255 over 32 buckets: 3
	// tenant-000..255 over 4096 buckets: 9
	// team-0..63-prod over 32 buckets: 30
}
