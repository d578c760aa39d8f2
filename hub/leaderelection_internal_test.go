package hub

import (
	"strings"
	"testing"
	"time"
)

// TestCheckLeaderElection: timing client-go's elector would refuse only at
// start is refused up front, naming the flags to change.
func TestCheckLeaderElection(t *testing.T) {
	tests := []struct {
		name                string
		lease, renew, retry time.Duration
		wantErr             string
	}{
		{"defaults", 0, 0, 0, ""},
		{"longer, for a slow API server", 60 * time.Second, 40 * time.Second, 5 * time.Second, ""},
		{"lease not past the deadline", 10 * time.Second, 0, 0, "--leader-elect-lease-duration"},
		{"deadline within the retries", 0, 2 * time.Second, 0, "--leader-elect-retry-period"},
		{"negative", -time.Second, 0, 0, "negative"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkLeaderElection(Options{LeaseDuration: tc.lease, RenewDeadline: tc.renew, RetryPeriod: tc.retry})
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
	if DefaultLeaseDuration <= DefaultRenewDeadline || float64(DefaultRenewDeadline) <= leaderelectionJitter*float64(DefaultRetryPeriod) {
		t.Errorf("the defaults %s/%s/%s do not pass", DefaultLeaseDuration, DefaultRenewDeadline, DefaultRetryPeriod)
	}
}
