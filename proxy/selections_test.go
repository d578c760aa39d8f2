package proxy

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
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
	s := newSelections(nil)
	s.now = func() time.Time { return now }

	if !settled(s.beginChange(1, allChanged)) {
		t.Fatal("a change with no informer did not settle at once")
	}

	// Two informers watching; pods was watched long ago and is gone.
	opened(t, s, pods, 1, false)
	s.watchClosed(pods)
	now = now.Add(time.Hour)
	s.markServed(cms, 1)
	opened(t, s, cms, 1, false)
	s.markServed(secrets, 1)
	opened(t, s, secrets, 1, false)
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
	opened(t, s, cms, 2, false)
	// secrets: a watch opened under the old epoch does not count.
	s.watchClosed(secrets)
	opened(t, s, secrets, 1, false)
	if settled(ch) {
		t.Fatal("an old-epoch watch settled the change")
	}
	s.watchClosed(secrets)
	opened(t, s, secrets, 2, false)
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
	opened(t, s, cms, 3, false)
	if settled(newer) {
		t.Fatal("a watch of epoch 3 settled the change to 4")
	}
	opened(t, s, cms, 4, false)
	opened(t, s, secrets, 4, false)
	if !settled(newer) {
		t.Fatalf("change to 4 not settled; pending %v", s.pending())
	}

	// A watch that streams its list (sendInitialEvents) counts once the
	// list has ended, not when it opens.
	ch = s.beginChange(5, allChanged)
	s.watchClosed(cms)
	opened(t, s, cms, 5, true)
	s.watchClosed(secrets)
	opened(t, s, secrets, 5, false)
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
	s := newSelections(nil)
	opened(t, s, cms, 1, false)
	opened(t, s, secrets, 1, false)
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
	opened(t, s, secrets, 2, false)
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
	s := newSelections(nil)
	s.now = func() time.Time { return now }
	cms := schema.GroupResource{Resource: "configmaps"}
	informer := selectionKey{gr: cms, labelSel: "app=x"}
	s.markServed(informer, 1)
	opened(t, s, informer, 1, false)
	closedRecently := selectionKey{gr: cms, labelSel: "app=y"}
	opened(t, s, closedRecently, 1, false)
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
	opened(t, s, informer, 2, false)
	opened(t, s, closedRecently, 2, false)
	select {
	case <-ch:
	default:
		t.Errorf("the change did not settle once both informers watched again; pending %v", s.pending())
	}
}

// opened is s.watchOpened, failing t on an error.
func opened(t *testing.T, s *selections, key selectionKey, epoch uint64, streamsList bool) {
	t.Helper()
	if err := s.watchOpened(key, epoch, streamsList); err != nil {
		t.Fatal(err)
	}
}

// TestStreamRecord: the streams that opened a watch are kept in the state
// directory as they open, read back by the next proxy as restored streams
// its first change waits for, and pruned of streams no longer remembered
// at the next rewrite; a record that does not parse, or cannot be
// written, is an error rather than a stream forgotten.
func TestStreamRecord(t *testing.T) {
	cms := selectionKey{gr: schema.GroupResource{Resource: "configmaps"}, namespace: "team-1", labelSel: "app=a"}
	secrets := selectionKey{gr: schema.GroupResource{Resource: "secrets"}}
	deployments := selectionKey{gr: schema.GroupResource{Group: "apps", Resource: "deployments"}, fieldSel: "metadata.name=x"}
	dir := t.TempDir()
	record, err := loadStreamRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	s := newSelections(record)
	opened(t, s, cms, 1, false)
	opened(t, s, secrets, 1, true)
	opened(t, s, cms, 1, false)

	restarted := func() *selections {
		t.Helper()
		record, err := loadStreamRecord(dir)
		if err != nil {
			t.Fatal(err)
		}
		return newSelections(record)
	}
	s = restarted()
	settled := s.beginChange(1, func(schema.GroupResource) bool { return false })
	for _, key := range []selectionKey{cms, secrets} {
		select {
		case <-settled:
			t.Fatalf("settled before %v relisted", key.gr)
		default:
		}
		opened(t, s, key, 1, false)
	}
	select {
	case <-settled:
	default:
		t.Fatal("not settled once every restored stream watched under the first rules")
	}

	// A stream the selections forgot is dropped at the next rewrite.
	delete(s.streams, secrets)
	opened(t, s, deployments, 1, false)
	s = restarted()
	if got := len(s.streams); got != 2 || s.streams[cms] == nil || s.streams[deployments] == nil {
		t.Errorf("restored %v, want configmaps and deployments", s.streams)
	}

	if err := os.WriteFile(filepath.Join(dir, streamsFile), []byte("{"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := loadStreamRecord(dir); err == nil || !strings.Contains(err.Error(), "restart the pod") {
		t.Errorf("a record that does not parse: %v, want an error saying to restart the pod", err)
	}

	record = &streamRecord{path: filepath.Join(dir, "gone", streamsFile), keys: map[selectionKey]bool{}}
	s = newSelections(record)
	if err := s.watchOpened(cms, 1, false); err == nil {
		t.Fatal("a watch whose stream cannot be recorded was let through")
	}
	if s.streams[cms] != nil && s.streams[cms].open > 0 || record.keys[cms] {
		t.Errorf("an unrecorded watch counted as open (%+v) or recorded (%v)", s.streams[cms], record.keys)
	}
}
