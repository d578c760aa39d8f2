package realpods_test

import (
	"os"
	"testing"

	"github.com/go-logr/logr"
	"k8s.io/klog/v2"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
)

// TestMain silences controller-runtime's and client-go's global loggers:
// the hub that TestNoDoubleReconcileOnRealPods runs in this process logs to
// a file of its own.
func TestMain(m *testing.M) {
	ctrllog.SetLogger(logr.Discard())
	klog.SetLogger(logr.Discard())
	os.Exit(m.Run())
}
