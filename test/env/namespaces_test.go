package env

import (
	"slices"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

func TestSpreadNamespaces(t *testing.T) {
	space := sharding.MustSpace(32)
	tests := []struct {
		name  string
		given []string
		n     int
	}{
		{name: "one", n: 1},
		{name: "a bucket each", n: 31},
		{name: "every bucket", n: 32},
		{name: "several per bucket", n: 200},
		{name: "after a given name", given: []string{"team-a"}, n: 20},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			names, count := SpreadNamespaces(space, "ns", tt.given, tt.n)
			if len(names) != tt.n {
				t.Fatalf("%d names, want %d", len(names), tt.n)
			}
			if !slices.Equal(names[:len(tt.given)], tt.given) {
				t.Errorf("names start %v, want the given %v", names[:len(tt.given)], tt.given)
			}
			if slices.Max(count)-slices.Min(count) > 1 {
				t.Errorf("bucket counts %v differ by more than one", count)
			}
			got := make([]int, space.Buckets())
			seen := map[string]bool{}
			for _, name := range names {
				if seen[name] {
					t.Errorf("%s twice", name)
				}
				seen[name] = true
				got[space.Bucket(name)]++
			}
			if !slices.Equal(got, count) {
				t.Errorf("counts %v, the names fall %v", count, got)
			}
			if tt.n <= space.Buckets() && slices.Max(count) > 1 {
				t.Errorf("%d names, but a bucket holds %d", tt.n, slices.Max(count))
			}
		})
	}
}
