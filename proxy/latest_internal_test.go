package proxy

import (
	"testing"
	"time"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// TestReplaceLatestNeverBlocks: the ShardRoute handler replaces the value
// the reporter has not taken yet while the reporter keeps taking values.
// The old replacement (send, else receive and send) blocked for good when
// the reporter took the value between the failed send and the receive.
func TestReplaceLatestNeverBlocks(t *testing.T) {
	latest := make(chan *ctrlmeshv1alpha1.ShardRoute, 1)
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case <-stop:
				return
			case <-latest:
			}
		}
	}()
	done := make(chan struct{})
	newest := &ctrlmeshv1alpha1.ShardRoute{}
	go func() {
		defer close(done)
		for range 200000 {
			replaceLatest(latest, &ctrlmeshv1alpha1.ShardRoute{})
		}
		replaceLatest(latest, newest)
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("replaceLatest blocked")
	}
}
