package shardingconfig

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestSelectorsImply: the static overlap check finds selectors of which one
// has every requirement of the other, and no others.
func TestSelectorsImply(t *testing.T) {
	labels := func(kv ...string) *metav1.LabelSelector {
		s := &metav1.LabelSelector{MatchLabels: map[string]string{}}
		for i := 0; i < len(kv); i += 2 {
			s.MatchLabels[kv[i]] = kv[i+1]
		}
		return s
	}
	in := func(key string, values ...string) *metav1.LabelSelector {
		return &metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{{Key: key, Operator: metav1.LabelSelectorOpIn, Values: values}}}
	}
	for _, tc := range []struct {
		name string
		a, b *metav1.LabelSelector
		want bool
	}{
		{"equal", labels("app", "op"), labels("app", "op"), true},
		{"one narrower", labels("app", "op"), labels("app", "op", "tier", "control"), true},
		{"narrower first", labels("app", "op", "tier", "control"), labels("app", "op"), true},
		{"same expression", in("app", "op", "other"), in("app", "other", "op"), true},
		{"other value", labels("app", "op"), labels("app", "other"), false},
		{"other keys", labels("app", "op"), labels("tier", "control"), false},
		{"both add a key", labels("app", "op", "a", "1"), labels("app", "op", "b", "2"), false},
		{"unparsable", &metav1.LabelSelector{MatchLabels: map[string]string{"app": "not a value"}}, labels("app", "op"), false},
	} {
		if got := selectorsImply(tc.a, tc.b); got != tc.want {
			t.Errorf("%s: selectorsImply = %v, want %v", tc.name, got, tc.want)
		}
	}
}
