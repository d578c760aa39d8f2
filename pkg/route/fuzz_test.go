package route

import (
	"encoding/json"
	"testing"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// FuzzCompile: any route spec either is refused or compiles into an
// assignment that gives every namespace at most one serving shard, agrees
// with the one ownership check, and never lets a pod serve a namespace
// another listed pod serves.
func FuzzCompile(f *testing.F) {
	f.Add(`{"buckets":32,"rulesHash":"h","routingGeneration":1,"shards":[{"id":"0","buckets":"0-15","pods":[{"name":"a"}]},{"id":"1","buckets":"16-31","pods":[{"name":"b"}]}]}`, "team-a")
	f.Add(`{"buckets":4,"shards":[{"id":"0","buckets":"0-3","pods":[{"name":"a"}]},{"id":"canary","namespaces":["team-a"],"canary":true,"pods":[{"name":"c"}]}]}`, "team-a")
	f.Add(`{"buckets":8,"shards":[{"id":"0","buckets":"0-7","pods":[{"name":"a"}]},{"id":"1","buckets":"3","pods":[{"name":"b"}]}]}`, "x")
	f.Add(`{"buckets":8,"shards":[{"id":"0","pendingBuckets":"0-7","pendingNamespaces":["n"],"pods":[{"name":"a"}]}]}`, "n")
	f.Fuzz(func(t *testing.T, specJSON, namespace string) {
		var spec ctrlmeshv1alpha1.ShardRouteSpec
		if json.Unmarshal([]byte(specJSON), &spec) != nil {
			return
		}
		space, table, parseErr := Parse(&spec)
		if parseErr == nil {
			if _, err := Validate(space, table.Shards); err != nil {
				// Compile must refuse what Validate refuses.
				if _, err := Compile(&spec, ""); err == nil {
					t.Fatalf("Validate refuses (%v) but Compile accepts %s", err, specJSON)
				}
				return
			}
		}
		// Pods of two shards never serve the same namespace, and a pod
		// serves a namespace only when its shard owns it.
		shardsServing := map[string]bool{}
		for _, s := range spec.Shards {
			for _, p := range s.Pods {
				a, err := Compile(&spec, p.Name)
				if err != nil || !a.Owns(namespace) {
					continue
				}
				shardsServing[a.Shard] = true
				if owner := a.OwnerOf(namespace); owner == nil || owner.ID != a.Shard {
					t.Fatalf("pod %s serves %q but the owner is %v", p.Name, namespace, owner)
				}
			}
		}
		if len(shardsServing) > 1 {
			t.Fatalf("namespace %q served by shards %v of %s", namespace, shardsServing, specJSON)
		}
	})
}
