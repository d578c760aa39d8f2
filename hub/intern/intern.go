// Package intern keeps one copy of each string the hub's cache holds many
// times over. Every object decoded from the API server holds its own copy
// of every string in it: at 1000 members x 100 configs, the 100,000 Works
// the hub caches repeat the same label keys, condition reasons and
// manifest identities, and each config's placement repeats its pods'
// names and shard states in every member. The hub's cache transforms
// intern those strings as the objects arrive; the copies the decoder
// made are then garbage.
package intern

import (
	"slices"
	"unique"
)

// String returns the canonical copy of s.
func String(s string) string {
	if s == "" {
		return s
	}
	return unique.Make(s).Value()
}

// Strings replaces each string of ss by its canonical copy.
func Strings(ss ...*string) {
	for _, s := range ss {
		*s = String(*s)
	}
}

// Slice replaces each string of ss by its canonical copy, in place.
func Slice(ss []string) {
	for i := range ss {
		ss[i] = String(ss[i])
	}
}

// Map returns m with canonical keys and values: a new map, since a map's
// keys cannot be replaced in place. Values listed in own keep their own
// copy: values unique to one object, which a canonical copy would only
// make cost more.
func Map(m map[string]string, own ...string) map[string]string {
	if m == nil {
		return nil
	}
	out := make(map[string]string, len(m))
	for k, v := range m {
		ck := String(k)
		if !slices.Contains(own, k) {
			v = String(v)
		}
		out[ck] = v
	}
	return out
}
