package route

import (
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// set32 parses a bucket set of space32.
func set32(t testing.TB, text string) sharding.Set {
	t.Helper()
	s, err := space32.ParseSet(text)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestValidate(t *testing.T) {
	shard := func(id, buckets, pending string, namespaces []string, podIDs ...PodID) Shard {
		return Shard{ID: id, Buckets: set32(t, buckets), PendingBuckets: set32(t, pending), Namespaces: namespaces, Pods: podIDs}
	}
	shards := []Shard{
		shard("0", "0-15", "", nil, pods("c1", "a")...),
		// 16-23 are pending for shard 1 and served by nobody yet; a pod name
		// may repeat in another cluster.
		shard("1", "24-31", "16-23", nil, pods("c2", "a")...),
		shard("canary", "", "", []string{"team-a"}, pods("c1", "z")...),
	}
	owners, err := Validate(space32, shards)
	if err != nil {
		t.Fatal(err)
	}
	for b, want := range map[int]string{0: "0", 15: "0", 16: "", 23: "", 24: "1", 31: "1"} {
		if got := owners.Bucket[b]; got != want {
			t.Errorf("bucket %d is served by %q, want %q", b, got, want)
		}
	}
	if got := owners.Namespace("team-a"); got != "canary" {
		t.Errorf("team-a is served by %q, want the canary", got)
	}
	other := "ns-0"
	if got, want := owners.Namespace(other), owners.Bucket[space32.Bucket(other)]; got != want {
		t.Errorf("%s is served by %q, want %q, the owner of its bucket", other, got, want)
	}

	for _, tc := range []struct {
		name   string
		space  sharding.Space
		shards []Shard
		want   string
	}{
		{"no space", sharding.Space{}, nil, "no bucket space"},
		{"an ID twice", space32, []Shard{shard("0", "0-7", "", nil), shard("0", "8-15", "", nil)}, `shard "0" is listed twice`},
		{"a set of another space", space32, []Shard{{ID: "0", Buckets: sharding.MustSpace(8).AllBuckets(), PendingBuckets: set32(t, "")}},
			`shard "0": buckets are a set of 8 buckets, want 32`},
		{"a zero set", space32, []Shard{{ID: "0", Buckets: set32(t, "0")}}, `shard "0": pending buckets are a set of 0 buckets, want 32`},
		{"a bucket twice", space32, []Shard{shard("0", "0-7", "", nil), shard("1", "7-15", "", nil)}, `bucket 7 is served by both shard "0" and shard "1"`},
		{"a namespace twice", space32, []Shard{shard("0", "", "", []string{"team-a"}), shard("1", "", "", []string{"team-a"})},
			`namespace "team-a" is served by both shard "0" and shard "1"`},
		{"a pod twice", space32, []Shard{shard("0", "0", "", nil, pods("c1", "a")...), shard("1", "1", "", nil, pods("c1", "a")...)},
			`pod c1/a is listed in both shard "0" and shard "1"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := Validate(tc.space, tc.shards); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
