package proxy

import (
	"fmt"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestSelectionsSettle(t *testing.T) {
	cms := selectionKey{gr: schema.GroupResource{Resource: "configmaps"}, labelSel: "app=x"}
	secrets := selectionKey{gr: schema.GroupResource{Resource: "secrets"}}
	pods := selectionKey{gr: schema.GroupResource{Resource: "pods"}}
	settled := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	allChanged := func(schema.GroupResource) bool { return false }
	now := time.Unix(1000, 0)
	s := newSelections()
	s.now = func() time.Time { return now }

	if !settled(s.beginChange(1, allChanged)) {
		t.Fatal("a change with no informer did not settle at once")
	}

	// Two informers watching; pods was watched long ago and is gone.
	s.watchOpened(pods, 1, false)
	s.watchClosed(pods)
	now = now.Add(time.Hour)
	s.markServed(cms, 1)
	s.watchOpened(cms, 1, false)
	s.markServed(secrets, 1)
	s.watchOpened(secrets, 1, false)
	ch := s.beginChange(2, allChanged)
	if settled(ch) {
		t.Fatal("settled while watches of the old epoch are open")
	}
	if got := s.pending(); len(got) != 2 {
		t.Fatalf("pending = %v, want configmaps and secrets only", got)
	}
	// configmaps: the old watch ends (410), the informer relists and
	// watches again under 2.
	s.watchClosed(cms)
	s.markServed(cms, 2)
	if settled(ch) {
		t.Fatal("a list alone settled: the informer may not have stored it yet")
	}
	s.watchOpened(cms, 2, false)
	// secrets: a watch opened under the old epoch does not count.
	s.watchClosed(secrets)
	s.watchOpened(secrets, 1, false)
	if settled(ch) {
		t.Fatal("an old-epoch watch settled the change")
	}
	s.watchClosed(secrets)
	s.watchOpened(secrets, 2, false)
	if !settled(ch) {
		t.Fatalf("not settled after both re-watched; pending %v", s.pending())
	}

	// An informer between two watches at the change (closed a moment ago)
	// is waited for too.
	s.watchClosed(cms)
	now = now.Add(time.Second)
	ch = s.beginChange(3, allChanged)
	if settled(ch) {
		t.Fatal("settled without the informer that was between watches")
	}

	// A newer change supersedes: the older waiter is released.
	newer := s.beginChange(4, allChanged)
	if !settled(ch) {
		t.Fatal("the superseded change's waiter was not released")
	}
	s.watchOpened(cms, 3, false)
	if settled(newer) {
		t.Fatal("a watch of epoch 3 settled the change to 4")
	}
	s.watchOpened(cms, 4, false)
	s.watchOpened(secrets, 4, false)
	if !settled(newer) {
		t.Fatalf("change to 4 not settled; pending %v", s.pending())
	}

	// A watch that streams its list (sendInitialEvents) counts once the
	// list has ended, not when it opens.
	ch = s.beginChange(5, allChanged)
	s.watchClosed(cms)
	s.watchOpened(cms, 5, true)
	s.watchClosed(secrets)
	s.watchOpened(secrets, 5, false)
	if settled(ch) {
		t.Fatal("settled while a watch of epoch 5 was still streaming its list")
	}
	s.listStreamed(cms, 5)
	if !settled(ch) {
		t.Fatalf("change to 5 not settled once the list was streamed; pending %v", s.pending())
	}
}

// TestSelectionsCarryUnchangedResources: a change that leaves a resource's
// selection alone waits only for the others; the unchanged stream counts as
// served under the new epoch, so its watch may resume.
func TestSelectionsCarryUnchangedResources(t *testing.T) {
	cms := selectionKey{gr: schema.GroupResource{Resource: "configmaps"}}
	secrets := selectionKey{gr: schema.GroupResource{Resource: "secrets"}}
	stale := selectionKey{gr: schema.GroupResource{Resource: "configmaps"}, namespace: "ns"}
	onlySecretsChanged := func(gr schema.GroupResource) bool { return gr.Resource != "secrets" }
	s := newSelections()
	s.watchOpened(cms, 1, false)
	s.watchOpened(secrets, 1, false)
	// A configmaps stream last served under an older epoch is not carried.
	s.markServed(stale, 0)

	ch := s.beginChange(2, onlySecretsChanged)
	if got := s.pending(); len(got) != 1 || s.servedEpoch(cms) != 2 {
		t.Fatalf("pending = %v, configmaps served under %d; want only secrets pending, configmaps carried to 2", got, s.servedEpoch(cms))
	}
	if s.servedEpoch(stale) != 0 {
		t.Fatalf("a stream served under epoch 0 was carried to %d", s.servedEpoch(stale))
	}
	s.watchClosed(secrets)
	s.watchOpened(secrets, 2, false)
	select {
	case <-ch:
	default:
		t.Fatalf("not settled once secrets re-watched; pending %v", s.pending())
	}
}

// TestSelectionsBounded: a client listing with ever new selectors does not
// grow the proxy without bound; streams with open watches, and those a
// change waits for, are never forgotten; a forgotten stream resuming a
// watch is sent to relist (servedEpoch 0).
func TestSelectionsBounded(t *testing.T) {
	now := time.Unix(1000, 0)
	s := newSelections()
	s.now = func() time.Time { return now }
	cms := schema.GroupResource{Resource: "configmaps"}
	informer := selectionKey{gr: cms, labelSel: "app=x"}
	s.markServed(informer, 1)
	s.watchOpened(informer, 1, false)
	closedRecently := selectionKey{gr: cms, labelSel: "app=y"}
	s.watchOpened(closedRecently, 1, false)
	s.watchClosed(closedRecently)
	ch := s.beginChange(2, func(schema.GroupResource) bool { return false })

	first := selectionKey{gr: cms, fieldSel: "metadata.name=first"}
	s.markServed(first, 2)
	for i := range 3 * maxStreams {
		now = now.Add(time.Millisecond)
		s.markServed(selectionKey{gr: cms, fieldSel: fmt.Sprintf("metadata.name=cm-%d", i)}, 2)
	}
	if got := len(s.streams); got > maxStreams {
		t.Errorf("%d streams remembered after %d distinct lists, want at most %d", got, 3*maxStreams, maxStreams)
	}
	if s.servedEpoch(first) != 0 {
		t.Error("the oldest list-only stream is still remembered")
	}
	if s.servedEpoch(informer) != 1 {
		t.Error("a stream with an open watch was forgotten")
	}
	if _, ok := s.streams[closedRecently]; !ok {
		t.Error("a stream the change waits for was forgotten")
	}
	s.watchOpened(informer, 2, false)
	s.watchOpened(closedRecently, 2, false)
	select {
	case <-ch:
	default:
		t.Errorf("the change did not settle once both informers watched again; pending %v", s.pending())
	}
}
