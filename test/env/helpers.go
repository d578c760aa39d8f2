package env

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Create creates obj, leaving one that exists (tests that share a fleet
// create the same namespaces), and fails t on any other error.
func Create(t testing.TB, ctx context.Context, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("creating %T %s: %v", obj, obj.GetName(), err)
	}
}

// pollInterval is how often Eventually checks.
const pollInterval = 100 * time.Millisecond

// Eventually calls check every pollInterval until it returns nil, and fails
// t with check's last error when within has passed.
func Eventually(t testing.TB, within time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, within, err)
		}
		time.Sleep(pollInterval)
	}
}
