package placement

import (
	"fmt"
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/pkg/route"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// describeTable prints a table one shard a line, pending parts in brackets.
func describeTable(r route.Table) string {
	var sb strings.Builder
	fmt.Fprintf(&sb, "gen %d", r.Generation)
	for _, s := range r.Shards {
		fmt.Fprintf(&sb, "; %s %q", s.ID, s.Buckets)
		if len(s.Namespaces) > 0 {
			fmt.Fprintf(&sb, " %v", s.Namespaces)
		}
		if !s.PendingBuckets.IsEmpty() || len(s.PendingNamespaces) > 0 {
			fmt.Fprintf(&sb, " pending %q %v", s.PendingBuckets, s.PendingNamespaces)
		}
	}
	return sb.String()
}

func describeChanges(cs []Change) string {
	var parts []string
	for _, c := range cs {
		part := fmt.Sprintf("%s %q", c.Shard, c.Buckets)
		if len(c.Namespaces) > 0 {
			part += fmt.Sprintf(" %v", c.Namespaces)
		}
		parts = append(parts, part)
	}
	return strings.Join(parts, "; ")
}

func mustHandover(t *testing.T, desired Placement, published route.Table, acks []PodAck) Step {
	t.Helper()
	step, err := Handover(desired, published, acks)
	if err != nil {
		t.Fatalf("Handover: %v", err)
	}
	return step
}

// TestHandoverMovesInTwoSteps walks one move through its generations: the
// first publication, a revoke, waiting for acknowledgements, the grant.
func TestHandoverMovesInTwoSteps(t *testing.T) {
	space := sharding.MustSpace(32)
	p0, p1 := route.PodID{Cluster: "a", Name: "p0"}, route.PodID{Cluster: "a", Name: "p1"}
	one := mustCompute(t, Input{Space: space, PodsPerShard: 1, Pods: makePods("a", "p0")})
	two := mustCompute(t, Input{Space: space, PodsPerShard: 1, Pods: makePods("a", "p0", "p1"), Previous: one})

	type call struct {
		desired     Placement
		acks        []PodAck
		wantTable   string
		wantChanged bool
		revoked     string
		granted     string
		waitingFor  string
	}
	calls := []call{
		{one, nil, `gen 1; 0 "0-31"`, true, "", `0 "0-31"`, "[]"},
		{one, nil, `gen 1; 0 "0-31"`, false, "", "", "[]"},
		// p1 appears: 16-31 leave shard 0 before shard 1 gets them.
		{two, []PodAck{{Pod: p0, Acked: 1}}, `gen 2; 0 "0-15"; 1 "" pending "16-31" []`, true, `0 "16-31"`, "", "[a/p0 a/p1]"},
		// Idempotent: no new acknowledgement, nothing new.
		{two, []PodAck{{Pod: p0, Acked: 1}}, `gen 2; 0 "0-15"; 1 "" pending "16-31" []`, false, "", "", "[a/p0 a/p1]"},
		// p0 has let go, but p1 might still load generation 1: wait.
		{two, []PodAck{{Pod: p0, Acked: 2}, {Pod: p1}}, `gen 2; 0 "0-15"; 1 "" pending "16-31" []`, false, "", "", "[a/p1]"},
		{two, []PodAck{{Pod: p0, Acked: 2}, {Pod: p1, Acked: 2}}, `gen 3; 0 "0-15"; 1 "16-31"`, true, "", `1 "16-31"`, "[]"},
		{two, []PodAck{{Pod: p0, Acked: 3}, {Pod: p1, Acked: 2}}, `gen 3; 0 "0-15"; 1 "16-31"`, false, "", "", "[]"},
	}
	var published route.Table
	for i, c := range calls {
		step := mustHandover(t, c.desired, published, c.acks)
		got := []string{describeTable(step.Table), fmt.Sprint(step.Changed), describeChanges(step.Revoked), describeChanges(step.Granted), fmt.Sprint(step.WaitingFor)}
		want := []string{c.wantTable, fmt.Sprint(c.wantChanged), c.revoked, c.granted, c.waitingFor}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("call %d: got\n%s\nwant\n%s", i, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}
		published = step.Table
	}
}

// TestHandoverFailover: when every pod of the previous owner is gone and the
// live pods enforce the latest rules, its buckets move in one step.
func TestHandoverFailover(t *testing.T) {
	space := sharding.MustSpace(8)
	p0, p1 := route.PodID{Cluster: "a", Name: "p0"}, route.PodID{Cluster: "a", Name: "p1"}
	two := mustCompute(t, Input{Space: space, PodsPerShard: 1, Pods: makePods("a", "p0", "p1")})
	published := mustHandover(t, two, route.Table{}, nil).Table
	one := mustCompute(t, Input{Space: space, PodsPerShard: 1, Pods: makePods("a", "p0"), Previous: two})

	// p1 is dead but not yet gone: revoke only.
	step := mustHandover(t, one, published, []PodAck{{Pod: p0, Acked: 1}, {Pod: p1, Acked: 1}})
	if got, want := describeTable(step.Table), `gen 2; 0 "0-3" pending "4-7" []`; got != want {
		t.Fatalf("p1 not gone: got %s, want %s", got, want)
	}
	// p1 gone, p0 at generation 1: straight to p0's shard.
	step = mustHandover(t, one, published, []PodAck{{Pod: p0, Acked: 1}, {Pod: p1, Acked: 1, Gone: true}})
	if got, want := describeTable(step.Table), `gen 2; 0 "0-7"`; got != want {
		t.Fatalf("p1 gone: got %s, want %s", got, want)
	}
	if got, want := describeChanges(step.Granted), `0 "4-7"`; got != want {
		t.Fatalf("granted %s, want %s", got, want)
	}
	// A pod the rules list and the report forgets is taken as live.
	step = mustHandover(t, one, published, []PodAck{{Pod: p0, Acked: 1}})
	if got, want := describeTable(step.Table), `gen 2; 0 "0-3" pending "4-7" []`; got != want {
		t.Fatalf("p1 unreported: got %s, want %s", got, want)
	}
}

// TestHandoverCanaryNamespaces: a namespace goes to the canary only after
// the shard that served it through its bucket has let go, and comes back the
// same way. Proxies cannot be told "nobody serves this namespace", so its
// bucket is held back meanwhile.
func TestHandoverCanaryNamespaces(t *testing.T) {
	space := sharding.MustSpace(4)
	bucket := space.Bucket("team-a")
	pods := append(makePods("a", "p0"), Pod{PodID: route.PodID{Cluster: "a", Name: "c0"}, Ready: true, Canary: true})
	acks := func(gen int64) []PodAck {
		return []PodAck{{Pod: route.PodID{Cluster: "a", Name: "p0"}, Acked: gen}, {Pod: route.PodID{Cluster: "a", Name: "c0"}, Acked: gen}}
	}
	before := mustCompute(t, Input{Space: space, PodsPerShard: 1, Pods: pods})
	published := mustHandover(t, before, route.Table{}, nil).Table
	withCanary := mustCompute(t, Input{Space: space, PodsPerShard: 1, Pods: pods, Previous: before,
		Canary: &CanaryStep{Buckets: mustSet(t, space, ""), Namespaces: []string{"team-a"}}})

	others := mustSet(t, space, "0-3").Difference(mustSet(t, space, fmt.Sprint(bucket)))
	steps := []struct {
		desired Placement
		want    string
	}{
		{withCanary, fmt.Sprintf(`gen 2; 0 %q pending "%d" []; canary "" pending "" [team-a]`, others, bucket)},
		{withCanary, `gen 3; 0 "0-3"; canary "" [team-a]`},
		{before, fmt.Sprintf(`gen 4; 0 %q pending "%d" []`, others, bucket)},
		{before, `gen 5; 0 "0-3"`},
	}
	for i, s := range steps {
		step := mustHandover(t, s.desired, published, acks(published.Generation))
		if got := describeTable(step.Table); got != s.want {
			t.Fatalf("step %d: got %s, want %s", i, got, s.want)
		}
		published = step.Table
	}
}

func TestHandoverRejects(t *testing.T) {
	space := sharding.MustSpace(8)
	good := mustCompute(t, Input{Space: space, PodsPerShard: 1, Pods: makePods("a", "p0", "p1")})
	published := mustHandover(t, good, route.Table{}, nil).Table
	overlapping := Placement{Space: space, Shards: []Shard{
		{ID: "0", Buckets: mustSet(t, space, "0-4")},
		{ID: "1", Buckets: mustSet(t, space, "4-7")},
	}}
	cases := []struct {
		name      string
		desired   Placement
		published route.Table
		acks      []PodAck
		want      string
	}{
		{"no space", Placement{}, route.Table{}, nil, "desired placement: no bucket space"},
		{"two owners desired", overlapping, route.Table{}, nil, `desired placement: bucket 4 is served by both shard "0" and shard "1"`},
		{"ack from the future", good, published, []PodAck{{Pod: route.PodID{Cluster: "a", Name: "p0"}, Acked: 2}}, "pod a/p0 acknowledged generation 2, but generation 1 is the latest published"},
		{"table of another space", mustCompute(t, Input{Space: sharding.MustSpace(16), PodsPerShard: 1}), published, nil, `the table published at generation 1: shard "0": buckets are a set of 8 buckets, want 16`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Handover(tc.desired, tc.published, tc.acks)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want one containing %q", err, tc.want)
			}
		})
	}
}
