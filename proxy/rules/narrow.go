package rules

import (
	"fmt"
	"net/url"

	"k8s.io/apimachinery/pkg/labels"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// Narrow adds the shard's selection and the limit's selector to a list or
// watch query: what the proxy sends kube-apiserver for every sharded read,
// and what proxybench sends without the proxy to tell the API server's share
// of a narrowed list from the proxy's. A selector the client already sent on
// the same key is intersected with the shard's, never overridden. In range
// mode it returns the hash ranges of the shardSelector it set, which the
// response must be proven against.
func (s *Snapshot) Narrow(query url.Values, limit *Limit) ([]sharding.HashRange, error) {
	reqs := append(labels.Requirements{}, limit.Requirements...)
	var ranges []sharding.HashRange
	switch s.Mode {
	case ModeRange:
		ranges = s.Ownership.HashRanges()
		if theirs := query.Get("shardSelector"); theirs != "" {
			parsed, err := sharding.ParseShardSelector(theirs)
			if err != nil {
				return nil, fmt.Errorf("the request's shardSelector: %w", err)
			}
			ranges = sharding.IntersectRanges(ranges, parsed)
			if len(ranges) == 0 {
				return nil, fmt.Errorf("the request's shardSelector %q selects nothing of this pod's shard (%s)", theirs, s.Ownership)
			}
		}
		query.Set("shardSelector", sharding.FormatShardSelector(ranges))
	case ModeLabel:
		own, err := s.Ownership.LabelRequirements()
		if err != nil {
			return nil, err
		}
		reqs = append(reqs, own...)
	}
	if len(reqs) == 0 {
		return ranges, nil
	}
	sel, err := labels.Parse(query.Get("labelSelector"))
	if err != nil {
		return nil, fmt.Errorf("the request's labelSelector: %w", err)
	}
	// labels.Selector.Add ANDs: a requirement on a key the client already
	// constrains narrows it further.
	query.Set("labelSelector", sel.Add(reqs...).String())
	return ranges, nil
}
