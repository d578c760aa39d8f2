// Package intern keeps one copy of each string the hub's cache holds many
// times over. Every object decoded from the API server holds its own copy
// of every string in it: at 1000 members x 100 configs, the 100,000 Works
// the hub caches repeat the same label keys, condition reasons and
// manifest identities, and each config's placement repeats its pods'
// names and shard states in every member. The hub's cache transforms
// intern those strings as the objects arrive; the copies the decoder
// made are then garbage. A canonical copy lasts as long as a string holds
// it, so that the strings interned before a collection and after it are
// one copy.
package intern

import (
	"hash/maphash"
	"runtime"
	"slices"
	"sync"
	"unsafe"
	"weak"
)

// The canonical copies, by the hash of their bytes: each a weak pointer to
// the bytes, which live as long as a string interned holds them. The
// unique package, which kept them before, holds its canonical copies by a
// weak pointer to a handle the interned strings do not hold: after every
// collection the next string of the same bytes made a copy anew, and the
// strings interned before and after it were two (TestInternOutlivesCollections).
var (
	mu    sync.Mutex
	seed  = maphash.MakeSeed()
	table = map[uint64][]canonical{}
)

// canonical is a canonical copy: its bytes, while held, and its length.
type canonical struct {
	data weak.Pointer[byte]
	len  int
}

// String returns the canonical copy of s.
func String(s string) string {
	if s == "" {
		return s
	}
	h := maphash.String(seed, s)
	mu.Lock()
	defer mu.Unlock()
	for _, c := range table[h] {
		if p := c.data.Value(); p != nil && c.len == len(s) && unsafe.String(p, c.len) == s {
			return unsafe.String(p, c.len)
		}
	}
	// At least 16 bytes: the allocator packs smaller objects without
	// pointers together, and the cleanup of one of them may never run
	// (runtime.AddCleanup).
	buf := make([]byte, max(len(s), 16))
	copy(buf, s)
	p := &buf[0]
	table[h] = append(table[h], canonical{data: weak.Make(p), len: len(s)})
	runtime.AddCleanup(p, forget, h)
	return unsafe.String(p, len(s))
}

// forget drops the canonical copies of hash h no string holds any more.
func forget(h uint64) {
	mu.Lock()
	defer mu.Unlock()
	held := slices.DeleteFunc(table[h], func(c canonical) bool { return c.data.Value() == nil })
	if len(held) == 0 {
		delete(table, h)
		return
	}
	table[h] = held
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
