package proxy

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

func TestSelectionsSettle(t *testing.T) {
	cms := selectionKey{gr: schema.GroupResource{Resource: "configmaps"}, labelSel: "app=x"}
	secrets := selectionKey{gr: schema.GroupResource{Resource: "secrets"}}
	settled := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}

	s := newSelections()
	if !settled(s.beginChange(1)) {
		t.Fatal("a change with no open watch did not settle at once")
	}

	s.markServed(cms, 1)
	s.watchOpened(cms)
	s.markServed(secrets, 1)
	s.watchOpened(secrets)
	ch := s.beginChange(2)
	if settled(ch) {
		t.Fatal("settled while watches of the old epoch are open")
	}
	if got := len(s.pending()); got != 2 {
		t.Fatalf("pending = %v", s.pending())
	}
	// The old watch ends (410) and the informer relists: served under 2.
	s.watchClosed(cms)
	s.markServed(cms, 2)
	if settled(ch) {
		t.Fatal("settled before secrets relisted")
	}
	// A late response of the old epoch does not count.
	s.markServed(secrets, 1)
	if settled(ch) {
		t.Fatal("an old-epoch response settled the change")
	}
	s.watchClosed(secrets)
	s.markServed(secrets, 2)
	if !settled(ch) {
		t.Fatalf("not settled after both relisted; pending %v", s.pending())
	}

	// A newer change supersedes an unsettled one.
	s.watchOpened(cms)
	old := s.beginChange(3)
	if settled(old) {
		t.Fatal("settled with a watch of epoch 2 open")
	}
	newer := s.beginChange(4)
	s.markServed(cms, 3)
	if settled(newer) {
		t.Fatal("a response of epoch 3 settled the change to 4")
	}
	s.markServed(cms, 4)
	if !settled(newer) {
		t.Fatal("change to 4 not settled")
	}
	if !settled(old) {
		t.Fatal("the superseded change's waiter was not released")
	}
}
