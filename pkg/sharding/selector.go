package sharding

import (
	"errors"
	"fmt"
	"strconv"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// ErrEmptySet is returned when a selector is asked for no buckets. An empty
// shardSelector or label requirement would mean "everything" to the API
// server, the opposite of what an empty set means.
var ErrEmptySet = errors.New("the bucket set is empty: a shard must own at least one bucket")

// NamespaceField is the object field the API server hashes for ctrlmesh's
// shard selectors.
const NamespaceField = "object.metadata.namespace"

// HashRanges is the set as maximal hash ranges: adjacent buckets merge into
// one range.
func (set Set) HashRanges() []HashRange {
	runs := set.runs()
	out := make([]HashRange, len(runs))
	for i, r := range runs {
		out[i] = set.space.runRange(r.first, r.last)
	}
	return out
}

// ShardSelector is the KEP-5866 shardSelector that selects the objects whose
// namespaces fall into the set's buckets, such as
// "shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000')".
// Adjacent buckets are merged into one shardRange.
func (set Set) ShardSelector() (string, error) {
	if set.IsEmpty() {
		return "", ErrEmptySet
	}
	return FormatShardSelector(set.HashRanges()), nil
}

// formatHex writes a hash bound as the API server requires: 0x and exactly 16
// lowercase hex digits.
func formatHex(v uint64) string { return fmt.Sprintf("0x%016x", v) }

// formatEnd writes the exclusive end of a range whose last value is last. The
// end of the whole space, 2^64, does not fit in uint64 and is written as the
// API server's one 17-digit bound.
func formatEnd(last uint64) string {
	if last == ^uint64(0) {
		return "0x10000000000000000"
	}
	return formatHex(last + 1)
}

// LabelValue is the value of the ctrlmesh.io/sharding-hash label for a bucket.
func LabelValue(bucket int) string { return strconv.Itoa(bucket) }

// LabelRequirement is the label-mode equivalent of ShardSelector:
// "ctrlmesh.io/sharding-hash in (…)" over the set's buckets.
func (set Set) LabelRequirement() (*labels.Requirement, error) {
	if set.IsEmpty() {
		return nil, ErrEmptySet
	}
	buckets := set.Buckets()
	values := make([]string, len(buckets))
	for i, b := range buckets {
		values[i] = LabelValue(b)
	}
	req, err := labels.NewRequirement(ctrlmeshv1alpha1.ShardingHashLabel, selection.In, values)
	if err != nil {
		return nil, fmt.Errorf("building the %s requirement: %w", ctrlmeshv1alpha1.ShardingHashLabel, err)
	}
	return req, nil
}

// LabelSelector is LabelRequirement as a selector.
func (set Set) LabelSelector() (labels.Selector, error) {
	req, err := set.LabelRequirement()
	if err != nil {
		return nil, err
	}
	return labels.NewSelector().Add(*req), nil
}
