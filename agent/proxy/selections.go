package proxy

import (
	"fmt"
	"sort"
	"sync"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// selectionKey identifies one list/watch stream of the operator: a resource,
// a namespace, and the client's own selectors. One informer keeps one key.
type selectionKey struct {
	gr                            schema.GroupResource
	namespace, labelSel, fieldSel string
}

// selections tracks, per key, the selection epoch its last response was
// served under and how many watches of it are open. From that the proxy
// knows when the operator has relisted after a selection change: when every
// key that had an open watch at the change has been served again under the
// new epoch.
type selections struct {
	mu     sync.Mutex
	served map[selectionKey]uint64
	open   map[selectionKey]int

	target  uint64
	waiting map[selectionKey]bool
	settled chan struct{}
}

func newSelections() *selections {
	return &selections{served: map[selectionKey]uint64{}, open: map[selectionKey]int{}}
}

func (s *selections) servedEpoch(key selectionKey) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served[key]
}

// markServed records that key was served under epoch.
func (s *selections) markServed(key selectionKey, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served[key] = epoch
	if epoch == s.target && s.waiting[key] {
		delete(s.waiting, key)
		s.settleIfDone()
	}
}

func (s *selections) watchOpened(key selectionKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.open[key]++
}

func (s *selections) watchClosed(key selectionKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[key]--; s.open[key] <= 0 {
		delete(s.open, key)
	}
}

// beginChange starts waiting for every key with an open watch to be served
// under epoch; the returned channel closes when they all have (at once when
// none is open), or when a newer change supersedes this one — the waiter
// then finds its rules are no longer the current ones.
func (s *selections) beginChange(epoch uint64) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.settled != nil {
		close(s.settled)
	}
	s.target = epoch
	s.waiting = map[selectionKey]bool{}
	for key := range s.open {
		if s.served[key] != epoch {
			s.waiting[key] = true
		}
	}
	settled := make(chan struct{})
	s.settled = settled
	s.settleIfDone()
	return settled
}

// pending lists the streams a change still waits for, for messages.
func (s *selections) pending() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.waiting))
	for key := range s.waiting {
		out = append(out, fmt.Sprintf("%s in %q (labelSelector %q, fieldSelector %q)", key.gr, key.namespace, key.labelSel, key.fieldSel))
	}
	sort.Strings(out)
	return out
}

func (s *selections) settleIfDone() {
	if len(s.waiting) == 0 && s.settled != nil {
		close(s.settled)
		s.settled = nil
	}
}
