package hub

import (
	"testing"

	"k8s.io/client-go/rest"
)

// TestClientConfig: the hub's client is not left at client-go's default
// limit (5 requests per second), which kept a hub of 100 configs over 100
// members placing for most of an hour (make bench-scale); flags pass
// through, and the caller's config is not changed.
func TestClientConfig(t *testing.T) {
	given := &rest.Config{Host: "https://hub"}
	tests := []struct {
		name      string
		qps       float32
		burst     int
		wantQPS   float32
		wantBurst int
	}{
		{"defaults", 0, 0, DefaultQPS, DefaultBurst},
		{"flags", 50, 80, 50, 80},
		{"no client-side limit", -1, 0, -1, DefaultBurst},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := clientConfig(Options{Config: given, QPS: tc.qps, Burst: tc.burst})
			if cfg.QPS != tc.wantQPS || cfg.Burst != tc.wantBurst {
				t.Errorf("QPS %v burst %d, want %v and %d", cfg.QPS, cfg.Burst, tc.wantQPS, tc.wantBurst)
			}
			if cfg.Host != given.Host || given.QPS != 0 || given.Burst != 0 {
				t.Errorf("config %+v from %+v", cfg, given)
			}
		})
	}
	if DefaultQPS <= rest.DefaultQPS || DefaultBurst <= rest.DefaultBurst {
		t.Errorf("the hub's defaults %d/%d are no more than client-go's %v/%d", DefaultQPS, DefaultBurst, rest.DefaultQPS, rest.DefaultBurst)
	}
}
