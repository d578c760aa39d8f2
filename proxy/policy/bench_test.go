package policy

import (
	"testing"

	"github.com/ctrlmesh/ctrlmesh/test/policies"
)

// BenchmarkCheck is the policy check's cost per request with 20 policies
// loaded (policies.Sample): a request no rule matches (the proxy's common
// case), and one that a rate limit, a breaker, a deny count and a fault
// all match, its outcome told to the breaker.
func BenchmarkCheck(b *testing.B) {
	set, err := Compile(policies.Sample(20), Target{Shard: "0"})
	if err != nil {
		b.Fatal(err)
	}
	for name, req := range map[string]*Request{
		"unmatched": {Resource: "configmaps", Verb: "get", Namespace: "a", Name: "x"},
		"matched":   {Group: "example.com", Resource: "things19", Verb: "get", Namespace: "a", Name: "x"},
	} {
		b.Run(name, func(b *testing.B) {
			e := NewEngine(set, nil)
			defer e.Stop()
			b.ReportAllocs()
			for b.Loop() {
				d := e.Check(req)
				e.Done(&d, 200, 0, false)
			}
		})
	}
}
