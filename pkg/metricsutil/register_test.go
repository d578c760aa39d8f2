package metricsutil_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ctrlmesh/ctrlmesh/pkg/metricsutil"
)

func TestRegisterReusesTheFirstCollector(t *testing.T) {
	reg := prometheus.NewRegistry()
	newCounter := func() prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: "things_total", Help: "Things."})
	}
	first, err := metricsutil.Register(reg, newCounter())
	if err != nil {
		t.Fatal(err)
	}
	second, err := metricsutil.Register(reg, newCounter())
	if err != nil {
		t.Fatal(err)
	}
	if first != second {
		t.Fatal("the second registration did not return the first collector")
	}
	// A different collector under the same name is still an error.
	if _, err := metricsutil.Register(reg, prometheus.NewGauge(prometheus.GaugeOpts{Name: "things_total", Help: "Other."})); err == nil {
		t.Fatal("a conflicting collector was registered")
	}
}
