package sharding

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
)

// ErrNotLabelExpressible is returned for an ownership that label selectors
// cannot state: whole buckets plus single namespaces from other buckets would
// need an OR, and label selectors only AND.
var ErrNotLabelExpressible = errors.New("buckets plus single namespaces of other buckets cannot be written as one label selector; use range mode (kube-apiserver with ShardedListAndWatch) or give the shard either buckets or namespaces")

// Ownership is what one shard serves: the namespaces whose bucket is in
// Buckets, except Excluded, plus Included. Included and Excluded carry canary
// namespaces, served exactly by one shard and by no other.
type Ownership struct {
	Buckets  Set
	Included []string
	Excluded []string
}

// NewOwnership builds an ownership; namespace lists are copied, sorted and
// deduplicated so that equal ownerships compare equal.
func NewOwnership(buckets Set, included, excluded []string) Ownership {
	return Ownership{Buckets: buckets, Included: sortedUnique(included), Excluded: sortedUnique(excluded)}
}

func sortedUnique(in []string) []string {
	if len(in) == 0 {
		return nil
	}
	out := slices.Clone(in)
	sort.Strings(out)
	return slices.Compact(out)
}

// Owns reports whether the shard serves the namespace.
func (o Ownership) Owns(namespace string) bool {
	if _, found := slices.BinarySearch(o.Included, namespace); found {
		return true
	}
	if _, found := slices.BinarySearch(o.Excluded, namespace); found {
		return false
	}
	return o.Buckets.HasNamespace(namespace)
}

// IsEmpty reports whether the shard serves nothing at all.
func (o Ownership) IsEmpty() bool { return o.Buckets.IsEmpty() && len(o.Included) == 0 }

// Equal reports whether both ownerships serve the same namespaces by the
// same rules.
func (o Ownership) Equal(other Ownership) bool {
	return o.Buckets.Equal(other.Buckets) && slices.Equal(o.Included, other.Included) && slices.Equal(o.Excluded, other.Excluded)
}

// String describes the ownership for messages: "buckets 0-7,12 + [team-a] - [team-b]".
func (o Ownership) String() string {
	var sb strings.Builder
	sb.WriteString("buckets ")
	if o.Buckets.IsEmpty() {
		sb.WriteString("none")
	} else {
		sb.WriteString(o.Buckets.String())
	}
	if len(o.Included) > 0 {
		fmt.Fprintf(&sb, " + namespaces %v", o.Included)
	}
	if len(o.Excluded) > 0 {
		fmt.Fprintf(&sb, " - namespaces %v", o.Excluded)
	}
	return sb.String()
}

// HashRanges is the ownership as sorted, maximal hash ranges: the bucket
// ranges with the hash point of each excluded namespace cut out, and the hash
// point of each included namespace added. A point is the range [h, h]; two
// namespaces whose 64-bit hashes collide cannot be told apart.
func (o Ownership) HashRanges() []HashRange {
	ranges := o.Buckets.HashRanges()
	for _, ns := range o.Excluded {
		ranges = cutPoint(ranges, Hash(ns))
	}
	for _, ns := range o.Included {
		ranges = append(ranges, HashRange{First: Hash(ns), Last: Hash(ns)})
	}
	return mergeRanges(ranges)
}

func cutPoint(ranges []HashRange, h uint64) []HashRange {
	out := make([]HashRange, 0, len(ranges)+1)
	for _, r := range ranges {
		if !r.Contains(h) {
			out = append(out, r)
			continue
		}
		if h > r.First {
			out = append(out, HashRange{First: r.First, Last: h - 1})
		}
		if h < r.Last {
			out = append(out, HashRange{First: h + 1, Last: r.Last})
		}
	}
	return out
}

// mergeRanges sorts ranges and merges those that overlap or touch.
func mergeRanges(ranges []HashRange) []HashRange {
	if len(ranges) == 0 {
		return nil
	}
	sorted := slices.Clone(ranges)
	slices.SortFunc(sorted, func(a, b HashRange) int {
		switch {
		case a.First < b.First:
			return -1
		case a.First > b.First:
			return 1
		}
		return 0
	})
	out := []HashRange{sorted[0]}
	for _, r := range sorted[1:] {
		last := &out[len(out)-1]
		// Touching: the next range starts right after the last one ends
		// (and the last one does not already end at the top of the space).
		if r.First <= last.Last || (last.Last != ^uint64(0) && r.First == last.Last+1) {
			if r.Last > last.Last {
				last.Last = r.Last
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// ShardSelector is the KEP-5866 selector of the ownership.
func (o Ownership) ShardSelector() (string, error) {
	if o.IsEmpty() {
		return "", ErrEmptySet
	}
	return FormatShardSelector(o.HashRanges()), nil
}

// FormatShardSelector writes ranges as a KEP-5866 shardSelector on the
// namespace field.
func FormatShardSelector(ranges []HashRange) string {
	parts := make([]string, len(ranges))
	for i, r := range ranges {
		parts[i] = fmt.Sprintf("shardRange(%s, '%s', '%s')", NamespaceField, formatHex(r.First), formatEnd(r.Last))
	}
	return strings.Join(parts, " || ")
}

// LabelRequirements are the label-mode requirements of the ownership, to be
// ANDed into a request's label selector.
func (o Ownership) LabelRequirements() ([]labels.Requirement, error) {
	switch {
	case o.IsEmpty():
		return nil, ErrEmptySet
	case !o.Buckets.IsEmpty() && len(o.Included) > 0:
		return nil, ErrNotLabelExpressible
	case len(o.Included) > 0:
		req, err := labels.NewRequirement(ctrlmeshv1alpha1.NamespaceLabel, selection.In, o.Included)
		if err != nil {
			return nil, fmt.Errorf("building the %s requirement: %w", ctrlmeshv1alpha1.NamespaceLabel, err)
		}
		return []labels.Requirement{*req}, nil
	}
	bucketReq, err := o.Buckets.LabelRequirement()
	if err != nil {
		return nil, err
	}
	reqs := []labels.Requirement{*bucketReq}
	if len(o.Excluded) > 0 {
		req, err := labels.NewRequirement(ctrlmeshv1alpha1.NamespaceLabel, selection.NotIn, o.Excluded)
		if err != nil {
			return nil, fmt.Errorf("building the %s requirement: %w", ctrlmeshv1alpha1.NamespaceLabel, err)
		}
		reqs = append(reqs, *req)
	}
	return reqs, nil
}
