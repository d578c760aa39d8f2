// Package metricsutil holds helpers for Prometheus metrics.
package metricsutil

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Register registers c on reg, or returns the equal collector registered
// before: components that are replaced at run time (the agent's labeler
// when its rules change), or run again in one process (tests), keep
// counting into the collectors registered first.
func Register[C prometheus.Collector](reg prometheus.Registerer, c C) (C, error) {
	err := reg.Register(c)
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing, nil
		}
	}
	if err != nil {
		return c, fmt.Errorf("registering metrics: %w", err)
	}
	return c, nil
}
