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

// maxStreams bounds how many streams selections remembers. Each distinct
// client selector is a stream, so a client that lists with ever new
// selectors (a field selector per object name, say) would otherwise grow the
// proxy without bound. Forgetting a stream is safe: a watch resuming on a
// forgotten stream is answered 410 and its informer relists.
const maxStreams = 4096

// stream is what selections knows of one key.
type stream struct {
	// served is the selection epoch the stream's last response was served
	// under.
	served uint64
	// open counts the stream's open watches.
	open int
	// closed is when its last watch closed; zero if none has.
	closed time.Time
	// active is when it was last served, opened or closed.
	active time.Time
	// restored marks a stream a proxy before this one recorded and this
	// one has not yet served a watch of: the operator's informer may hold
	// what that proxy served it.
	restored bool
}

// selections tracks, per key, the selection epoch its last response was
// served under, its open watches, and when its last watch closed. From that
// the proxy knows when the operator has taken up a selection change: when
// every stream an informer keeps — a watch open at the change, or closed
// shortly before — has opened a watch under the new epoch. A client-go
// reflector opens its watch only after it has stored the list that precedes
// it, so a new-epoch watch means the informer's cache holds the new
// selection.
//
// Streams without open watches are forgotten recentWatch after they were
// last active, and the least recently active ones beyond maxStreams, so the
// memory it holds is bounded by the operator's live informers, not by every
// selector a client ever sent.
type selections struct {
	mu      sync.Mutex
	now     func() time.Time
	streams map[selectionKey]*stream

	target  uint64
	waiting map[selectionKey]bool
	settled chan struct{}

	// record keeps the streams that opened a watch in the proxy's state
	// directory, for a proxy restarted alone; nil without one.
	record *streamRecord
}

// newSelections starts with the streams of record, if any, as restored:
// the first change waits for each of them as for a watch open at it.
func newSelections(record *streamRecord) *selections {
	s := &selections{now: time.Now, streams: map[selectionKey]*stream{}, record: record}
	if record != nil {
		for key := range record.keys {
			s.stream(key).restored = true
		}
	}
	return s
}

// stream returns key's record, made and marked active now.
func (s *selections) stream(key selectionKey) *stream {
	st, ok := s.streams[key]
	if !ok {
		st = &stream{active: s.now()}
		s.streams[key] = st
		s.forget()
	}
	st.active = s.now()
	return st
}

// forget drops, once more than maxStreams are remembered, the streams
// without open watches that were inactive for recentWatch, then the least
// recently active streams without open watches (or waited for by a
// change) until a quarter of maxStreams is free again, so that it runs
// once per many new streams.
func (s *selections) forget() {
	if len(s.streams) <= maxStreams {
		return
	}
	now := s.now()
	var idle []selectionKey
	for key, st := range s.streams {
		if st.open > 0 || s.waiting[key] {
			continue
		}
		if now.Sub(st.active) >= recentWatch {
			delete(s.streams, key)
			continue
		}
		idle = append(idle, key)
	}
	if excess := len(s.streams) - maxStreams*3/4; excess > 0 {
		sort.Slice(idle, func(a, b int) bool { return s.streams[idle[a]].active.Before(s.streams[idle[b]].active) })
		for _, key := range idle[:min(excess, len(idle))] {
			delete(s.streams, key)
		}
	}
}

func (s *selections) servedEpoch(key selectionKey) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st, ok := s.streams[key]; ok {
		return st.served
	}
	return 0
}

// markServed records that a list or watch of key was served under epoch.
func (s *selections) markServed(key selectionKey, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.stream(key).served = epoch
}

// watchOpened records a watch of key opened under epoch. A watch that
// streams its list first (sendInitialEvents, client-go's WatchListClient)
// is served under epoch only once that list has ended (listStreamed): until
// then the informer's cache holds what it held before. It fails when the
// stream cannot be recorded: the caller refuses the watch.
func (s *selections) watchOpened(key selectionKey, epoch uint64, streamsList bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.record != nil {
		if err := s.record.add(key, func(k selectionKey) bool { return s.streams[k] != nil }); err != nil {
			return err
		}
	}
	st := s.stream(key)
	st.open++
	if !streamsList {
		s.servedLocked(key, st, epoch)
	}
	return nil
}

// listStreamed records that a watch of key opened under epoch has streamed
// its initial list to the operator: the informer replaces its cache with it.
func (s *selections) listStreamed(key selectionKey, epoch uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.servedLocked(key, s.stream(key), epoch)
}

// servedLocked records that key's informer holds the selection of epoch;
// the caller holds mu.
func (s *selections) servedLocked(key selectionKey, st *stream, epoch uint64) {
	st.served = epoch
	st.restored = false
	if epoch == s.target && s.waiting[key] {
		delete(s.waiting, key)
		s.settleIfDone()
	}
}

func (s *selections) watchClosed(key selectionKey) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stream(key)
	st.open = max(st.open-1, 0)
	st.closed = st.active
}

// beginChange starts waiting for every key of a changed resource with an
// open watch (or one closed lately, or restored) to be served under epoch; the returned channel closes when
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
	now := s.now()
	for key, st := range s.streams {
		if st.served == epoch-1 && unchanged(key.gr) {
			st.served = epoch
		}
		// A key served under epoch by now (carried over above, or a watch
		// opened under the new state before this call) waits for nothing.
		if st.served == epoch {
			continue
		}
		if st.open > 0 || st.restored || (!st.closed.IsZero() && now.Sub(st.closed) < recentWatch) {
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
