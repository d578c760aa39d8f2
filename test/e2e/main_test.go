// Package e2e_test holds end-to-end tests on a local fleet (package
// localfleet, with the helpers of package fleettest): real kube-apiservers
// and etcds, the hub and the agents in this process, the demo operator's
// pods as ctrlmesh-proxy and demo-operator processes that record every
// reconcile.
package e2e_test

import (
	"testing"

	"github.com/ctrlmesh/ctrlmesh/test/fleettest"
)

func TestMain(m *testing.M) { fleettest.Main(m) }
