package sharding

import (
	"fmt"
	"strconv"
	"strings"
)

// ParseShardSelector reads a KEP-5866 shardSelector on the namespace field —
// "shardRange(object.metadata.namespace, '0x…', '0x…') || …" — into sorted,
// merged hash ranges. It accepts what kube-apiserver accepts for that field
// (16-digit lowercase hex bounds, the end 0x10000000000000000, start < end),
// so that the proxy can intersect a client's own selector with the shard's
// instead of overriding it. Selectors on other fields are refused: they
// cannot be combined with a namespace selector in one request.
func ParseShardSelector(selector string) ([]HashRange, error) {
	if strings.TrimSpace(selector) == "" {
		return nil, fmt.Errorf("empty shard selector")
	}
	var ranges []HashRange
	for i, term := range strings.Split(selector, "||") {
		r, err := parseShardRange(strings.TrimSpace(term))
		if err != nil {
			return nil, fmt.Errorf("shard selector term %d: %w", i+1, err)
		}
		ranges = append(ranges, r)
	}
	return mergeRanges(ranges), nil
}

func parseShardRange(term string) (HashRange, error) {
	inner, ok := strings.CutPrefix(term, "shardRange(")
	if !ok {
		return HashRange{}, fmt.Errorf("%q is not a shardRange(field, 'start', 'end') call", term)
	}
	inner, ok = strings.CutSuffix(inner, ")")
	if !ok {
		return HashRange{}, fmt.Errorf("%q lacks its closing parenthesis", term)
	}
	args := strings.Split(inner, ",")
	if len(args) != 3 {
		return HashRange{}, fmt.Errorf("shardRange takes 3 arguments, %q has %d", term, len(args))
	}
	if field := strings.TrimSpace(args[0]); field != NamespaceField {
		return HashRange{}, fmt.Errorf("shardRange on %q: only %s can be combined with ctrlmesh's shard", field, NamespaceField)
	}
	start, err := parseBound(args[1], false)
	if err != nil {
		return HashRange{}, fmt.Errorf("start: %w", err)
	}
	end, err := parseBound(args[2], true)
	if err != nil {
		return HashRange{}, fmt.Errorf("end: %w", err)
	}
	// end is exclusive; endIsTop stands for 2^64.
	if !end.top && end.value <= start.value {
		return HashRange{}, fmt.Errorf("start %s must be less than end %s", formatHex(start.value), formatHex(end.value))
	}
	last := end.value - 1
	if end.top {
		last = ^uint64(0)
	}
	return HashRange{First: start.value, Last: last}, nil
}

type bound struct {
	value uint64
	top   bool // 2^64, only as an end
}

func parseBound(arg string, isEnd bool) (bound, error) {
	arg = strings.TrimSpace(arg)
	lit, ok := strings.CutPrefix(arg, "'")
	if ok {
		lit, ok = strings.CutSuffix(lit, "'")
	}
	if !ok {
		return bound{}, fmt.Errorf("%q must be a quoted string such as '0x0000000000000000'", arg)
	}
	if isEnd && lit == "0x10000000000000000" {
		return bound{top: true}, nil
	}
	hex, ok := strings.CutPrefix(lit, "0x")
	if !ok || len(hex) != 16 || strings.Trim(hex, "0123456789abcdef") != "" {
		return bound{}, fmt.Errorf("%q must be 0x and 16 lowercase hex digits", lit)
	}
	v, err := strconv.ParseUint(hex, 16, 64)
	if err != nil {
		return bound{}, fmt.Errorf("%q: %w", lit, err)
	}
	return bound{value: v}, nil
}

// IntersectRanges is the set of hashes in both a and b; both must be sorted
// and merged, as HashRanges and ParseShardSelector return them.
func IntersectRanges(a, b []HashRange) []HashRange {
	var out []HashRange
	for i, j := 0, 0; i < len(a) && j < len(b); {
		first := max(a[i].First, b[j].First)
		last := min(a[i].Last, b[j].Last)
		if first <= last {
			out = append(out, HashRange{First: first, Last: last})
		}
		if a[i].Last < b[j].Last {
			i++
		} else {
			j++
		}
	}
	return out
}
