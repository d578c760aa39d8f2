package operator_test

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/scenarios/demo-operator/operator"
)

func TestDataHash(t *testing.T) {
	hash := func(data map[string]string, binary map[string][]byte) string {
		return operator.DataHash(&corev1.ConfigMap{Data: data, BinaryData: binary})
	}
	base := hash(map[string]string{"a": "1", "b": "2"}, nil)
	tests := []struct {
		name     string
		got      string
		wantSame bool // as base
	}{
		{name: "same data, built in another order", got: hash(map[string]string{"b": "2", "a": "1"}, nil), wantSame: true},
		{name: "a value changed", got: hash(map[string]string{"a": "1", "b": "3"}, nil)},
		{name: "a key added", got: hash(map[string]string{"a": "1", "b": "2", "c": ""}, nil)},
		{name: "key and value boundary moved", got: hash(map[string]string{"a": "1", "b2": ""}, nil)},
		{name: "the same entries as binary data", got: hash(nil, map[string][]byte{"a": []byte("1"), "b": []byte("2")})},
		{name: "empty", got: hash(nil, nil)},
	}
	hex16 := regexp.MustCompile(`^[0-9a-f]{16}$`)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if !hex16.MatchString(tt.got) {
				t.Fatalf("DataHash = %q, want 16 hex digits", tt.got)
			}
			if (tt.got == base) != tt.wantSame {
				t.Fatalf("DataHash = %q, base %q, want same=%v", tt.got, base, tt.wantSame)
			}
		})
	}
	// Known value: sha256("d\x00a\x001\x00d\x00b\x002\x00"), first 16 hex digits.
	if base != "c9c20103833ad5c8" {
		t.Errorf("DataHash(a=1,b=2) = %q; the hash input format changed", base)
	}
}

// TestRunRejectsInvalidOptions needs no API server: Run checks its options
// before it connects to anything.
func TestRunRejectsInvalidOptions(t *testing.T) {
	cfg := &rest.Config{Host: "https://127.0.0.1:1"}
	valid := operator.Options{Config: cfg, PodName: "p", LeaderElectionNamespace: "ns"}
	tests := []struct {
		name    string
		mutate  func(*operator.Options)
		wantErr string
	}{
		{name: "no config", mutate: func(o *operator.Options) { o.Config = nil }, wantErr: "no rest config"},
		{name: "no pod name", mutate: func(o *operator.Options) { o.PodName = "" }, wantErr: "no pod name"},
		{name: "no lock namespace", mutate: func(o *operator.Options) { o.LeaderElectionNamespace = "" }, wantErr: "no leader election namespace"},
		{name: "lease not longer than renew deadline", mutate: func(o *operator.Options) {
			o.LeaseDuration, o.RenewDeadline = 2*time.Second, 2*time.Second
		}, wantErr: "must be longer than renew deadline"},
		{name: "renew deadline too short for retry period", mutate: func(o *operator.Options) {
			o.RenewDeadline, o.RetryPeriod = time.Second, time.Second
		}, wantErr: "1.2 × retry period"},
		{name: "webhook port out of range", mutate: func(o *operator.Options) { o.WebhookPort = 70000 }, wantErr: "webhook port 70000"},
		{name: "negative delay", mutate: func(o *operator.Options) { o.ReconcileDelay = -time.Second }, wantErr: "reconcile delay"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := valid
			tt.mutate(&opts)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			err := operator.Run(ctx, opts)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "invalid options") {
				t.Fatalf("Run() = %v, want an invalid-options error containing %q", err, tt.wantErr)
			}
		})
	}
}
