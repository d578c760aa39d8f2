package proxy

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// selectionKey identifies one list/watch stream of the operator: a resource,
// a namespace, and the client's own selectors. One informer keeps one key.
type selectionKey struct {
	gr                            schema.GroupResource
	namespace, labelSel, fieldSel string
}

// recentWatch is how long after its last watch closed a stream still counts
// as an informer that will come back (client-go reflectors back off for up
// to a few seconds between watches, and re-watch after server timeouts).
const recentWatch = 2 * time.Minute

// selections tracks, per key, the selection epoch its last response was
// served under, its open watches, and when its last watch closed. From that
// the proxy knows when the operator has taken up a selection change: when
// every stream an informer keeps — a watch open at the change, or closed
// shortly before — has opened a watch under the new epoch. A client-go
// reflector opens its watch only after it has stored the list that precedes
// it, so a new-epoch watch means the informer's cache holds the new
// selection.
type selections struct {
	mu         sync.Mutex
	now        func() time.Time
	served     map[selectionKey]uint64
	open       map[selectionKey]int
	lastClosed map[selectionKey]time.Time

	target  uint64
	waiting map[selectionKey]bool
	settled chan struct{}
}

func newSelections() *selections {
	return &selections{now: time.Now, served: map[selectionKey]uint64{}, open: map[selectionKey]int{}, lastClosed: map[selectionKey]time.Time{}}
}

func (s *selections) servedEpoch(key selectionKey) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.served[key]
}

// markServed records that a list or watch of key was served under epoch.
func (s *selections) markServed(key selectionKey, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served[key] = epoch
}

// watchOpened records a watch of key opened under epoch.
func (s *selections) watchOpened(key selectionKey, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.served[key] = epoch
	s.open[key]++
	if epoch == s.target && s.waiting[key] {
		delete(s.waiting, key)
		s.settleIfDone()
	}
}

func (s *selections) watchClosed(key selectionKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.open[key]--; s.open[key] <= 0 {
		delete(s.open, key)
	}
	s.lastClosed[key] = s.now()
}

// beginChange starts waiting for every key of a changed resource with an
// open watch to be served under epoch; the returned channel closes when
// they all have (at once when none is open), or when a newer change
// supersedes this one — the waiter then finds its rules are no longer the
// current ones. Keys of resources whose selection is unchanged and that
// were served under the previous epoch count as served under epoch: their
// watches go on.
func (s *selections) beginChange(epoch uint64, unchanged func(schema.GroupResource) bool) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.settled != nil {
		close(s.settled)
	}
	s.target = epoch
	s.waiting = map[selectionKey]bool{}
	for key, served := range s.served {
		if served == epoch-1 && unchanged(key.gr) {
			s.served[key] = epoch
		}
	}
	// A key served under epoch by now (carried over above, or a watch
	// opened under the new state before this call) waits for nothing.
	for key := range s.open {
		if s.served[key] != epoch {
			s.waiting[key] = true
		}
	}
	for key, closed := range s.lastClosed {
		if s.now().Sub(closed) < recentWatch {
			if s.served[key] != epoch {
				s.waiting[key] = true
			}
		} else if s.open[key] == 0 {
			delete(s.lastClosed, key)
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
