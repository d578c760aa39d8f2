package proxy

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// TestAppliedWaitsForTheRelist: rules are reported applied only once the
// operator has relisted under their selection, also when they leave the
// selection of rules that were not applied yet as it was. A real CI run saw
// why: rules revoking buckets (generation 14) were followed 0.6 s later by
// rules of the same selection (15); the proxy reported 15 applied at once,
// the hub granted the buckets to another pod, and this pod's operator,
// which had not relisted yet, reconciled one of their objects from its
// cache at the same time as its new owner.
func TestAppliedWaitsForTheRelist(t *testing.T) {
	f := newAppliedFixture(t)
	f.p.SetRules(f.compile("a", 1, "0-15"))
	f.waitApplied("a", "once the first rules are in force")
	ended := f.watch("")

	// b revokes buckets 8-15: the operator's watch ends, and b waits for it
	// to come back under b's selection.
	f.p.SetRules(f.compile("b", 2, "0-7"))
	f.waitEnded(ended, "b narrowed the selection")
	f.checkApplied("a", "before the operator relisted under b")
	// c leaves b's selection as it was: b is not taken up yet, so neither
	// is c.
	f.p.SetRules(f.compile("c", 3, "0-7"))
	f.checkApplied("a", "before the operator relisted under c's selection")
	// The operator relists and watches again: c is taken up.
	f.watch("")
	f.waitApplied("c", "once the operator watches under c's selection")
	// d leaves c's selection as it was, and c is taken up: d is at once.
	f.p.SetRules(f.compile("d", 4, "0-7"))
	f.checkApplied("d", "right after d, of c's selection taken up")
}

// TestAppliedWaitsForTheStreamedList: an operator whose informers stream
// their lists (client-go's WatchListClient, on by default from client-go
// v0.35) takes up new rules once the list streamed under them has ended,
// not when the watch streaming it opens: until its initial-events-end
// bookmark the informer's cache holds what it held before.
func TestAppliedWaitsForTheStreamedList(t *testing.T) {
	f := newAppliedFixture(t)
	f.p.SetRules(f.compile("a", 1, "0-15"))
	f.waitApplied("a", "once the first rules are in force")
	ended := f.watch("&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
	f.upstream.release <- struct{}{}

	f.p.SetRules(f.compile("b", 2, "0-7"))
	f.waitEnded(ended, "b narrowed the selection")
	f.watch("&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true")
	// The watch is open under b and has streamed one object of its list.
	time.Sleep(100 * time.Millisecond)
	f.checkApplied("a", "while the operator's list under b was still streaming")
	f.upstream.release <- struct{}{}
	f.waitApplied("b", "once the list streamed under b has ended")
}

// TestAppliedAfterARestartWaitsForTheRelist: a proxy restarted alone, its
// operator running on, counts its first rules applied only once the
// operator's informers have relisted under them: they hold what the proxy
// before served them, here buckets 8-15 the new rules no longer give the
// pod. Before, the new proxy knew none of the operator's streams and
// reported its first rules applied at once, so the hub could grant those
// buckets elsewhere while this operator reconciled their objects from its
// cache.
func TestAppliedAfterARestartWaitsForTheRelist(t *testing.T) {
	upstream, state := holdingUpstream(t), t.TempDir()
	before := newAppliedFixtureOn(t, upstream, state)
	before.p.SetRules(before.compile("a", 1, "0-15"))
	before.waitApplied("a", "once the first rules are in force")
	before.watch("")
	before.p.Stop()

	after := newAppliedFixtureOn(t, upstream, state)
	after.p.SetRules(after.compile("b", 2, "0-7"))
	time.Sleep(100 * time.Millisecond)
	after.checkApplied("", "by a restarted proxy before the operator relisted under its first rules")
	// The reflector resumes from the resourceVersion the proxy before
	// served: sent to relist.
	rec := httptest.NewRecorder()
	after.p.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/api/v1/configmaps?watch=true&resourceVersion=4", nil))
	if rec.Code != http.StatusGone {
		t.Fatalf("a watch resuming from the proxy before's resourceVersion: %d, want 410", rec.Code)
	}
	after.checkApplied("", "after the resumed watch was sent to relist")
	// It relists and watches again: b is taken up.
	after.watch("")
	after.waitApplied("b", "once the operator watches under b")

	// A stream that opens its first watch is recorded: a proxy restarted
	// once more waits for both.
	after.watchOf("secrets", "")
	after.p.Stop()
	again := newAppliedFixtureOn(t, upstream, state)
	again.p.SetRules(again.compile("c", 3, "0-7"))
	again.watch("")
	time.Sleep(100 * time.Millisecond)
	again.checkApplied("", "before the Secrets' informer relisted too")
	again.watchOf("secrets", "")
	again.waitApplied("c", "once both informers watch under c")
}

// TestUnrecordableWatchRefused: a watch whose stream the proxy cannot
// record in its state directory is refused with 503 and never reaches the
// API server. Served unrecorded, a proxy restarted after this one would not
// wait for the stream to relist before reporting its first rules applied.
func TestUnrecordableWatchRefused(t *testing.T) {
	upstream, state := holdingUpstream(t), t.TempDir()
	f := newAppliedFixtureOn(t, upstream, state)
	f.p.SetRules(f.compile("a", 1, "0-15"))
	f.waitApplied("a", "once the first rules are in force")
	// The pod's emptyDir gone: nothing can be written there.
	if err := os.RemoveAll(state); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rec := httptest.NewRecorder()
	f.p.ServeHTTP(rec, httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/v1/configmaps?watch=true", nil))
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "streams.json") {
		t.Errorf("a watch whose stream cannot be recorded: %d %s, want 503 naming the record", rec.Code, rec.Body)
	}
	select {
	case <-upstream.watches:
		t.Error("the unrecorded watch reached the API server")
	default:
	}
}

// appliedFixture is a proxy for pod "p" (shard "0", label mode) in front of
// a heldUpstream, with what the Applied tests do with it.
type appliedFixture struct {
	t        *testing.T
	p        *Proxy
	upstream *heldUpstream
}

func newAppliedFixture(t *testing.T) *appliedFixture {
	return newAppliedFixtureOn(t, holdingUpstream(t), "")
}

// newAppliedFixtureOn is an appliedFixture in front of upstream, keeping
// its state in stateDir ("" for none).
func newAppliedFixtureOn(t *testing.T, upstream *heldUpstream, stateDir string) *appliedFixture {
	p, err := New(Config{Upstream: &rest.Config{Host: upstream.URL}, Scopes: clusterScoped, Log: testr.New(t), SettleTimeout: time.Hour, StateDir: stateDir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Stop)
	return &appliedFixture{t: t, p: p, upstream: upstream}
}

// compile is fenceRoute with shard "0" serving buckets, as hash at
// generation.
func (f *appliedFixture) compile(hash string, generation int64, buckets string) *rules.Snapshot {
	f.t.Helper()
	r := fenceRoute()
	r.Spec.RulesHash, r.Spec.RoutingGeneration = hash, generation
	r.Spec.Shards[0].Buckets = buckets
	snap, err := rules.Compile(r, "p", rules.ModeLabel, clusterScoped)
	if err != nil {
		f.t.Fatal(err)
	}
	return snap
}

// applied is the hash of the rules the proxy reports applied.
func (f *appliedFixture) applied() string {
	snap, _ := f.p.Applied()
	if snap == nil {
		return ""
	}
	return snap.Hash()
}

func (f *appliedFixture) checkApplied(want, when string) {
	f.t.Helper()
	if got := f.applied(); got != want {
		f.t.Fatalf("applied %q %s, want %q", got, when, want)
	}
}

func (f *appliedFixture) waitApplied(want, when string) {
	f.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for f.applied() != want {
		if time.Now().After(deadline) {
			f.t.Fatalf("applied %q %s, want %q", f.applied(), when, want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// watch opens the operator's ConfigMap watch through the proxy, with query
// added; it returns once the watch reached the API server, with the
// watch's end.
func (f *appliedFixture) watch(query string) <-chan struct{} {
	f.t.Helper()
	return f.watchOf("configmaps", query)
}

// watchOf is watch of the core resource named resource.
func (f *appliedFixture) watchOf(resource, query string) <-chan struct{} {
	f.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	f.t.Cleanup(cancel)
	req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/api/v1/"+resource+"?watch=true"+query, nil)
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		f.p.ServeHTTP(httptest.NewRecorder(), req)
	}()
	select {
	case <-f.upstream.watches:
	case <-time.After(10 * time.Second):
		f.t.Fatal("the watch did not reach the API server")
	}
	return ended
}

func (f *appliedFixture) waitEnded(ended <-chan struct{}, why string) {
	f.t.Helper()
	select {
	case <-ended:
	case <-time.After(10 * time.Second):
		f.t.Fatalf("the watch did not end when %s", why)
	}
}

// heldUpstream stands for kube-apiserver serving watches that stay open
// until the client goes away; watches receives one value per watch. A
// watch streaming its list (sendInitialEvents) sends one object, then the
// bookmark ending the list once a value arrives on release.
type heldUpstream struct {
	*httptest.Server
	watches chan struct{}
	release chan struct{}
}

func holdingUpstream(t *testing.T) *heldUpstream {
	t.Helper()
	u := &heldUpstream{watches: make(chan struct{}, 16), release: make(chan struct{}, 16)}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		if r.URL.Query().Get("watch") != "true" {
			_, _ = io.WriteString(w, `{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"1"},"items":[]}`)
			return
		}
		w.WriteHeader(http.StatusOK)
		if r.URL.Query().Get("sendInitialEvents") == "true" {
			_, _ = io.WriteString(w, `{"type":"ADDED","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"namespace":"`+mine+`","name":"a","resourceVersion":"4"}}}`+"\n")
		}
		w.(http.Flusher).Flush()
		u.watches <- struct{}{}
		if r.URL.Query().Get("sendInitialEvents") == "true" {
			select {
			case <-u.release:
			case <-r.Context().Done():
				return
			}
			_, _ = io.WriteString(w, `{"type":"BOOKMARK","object":{"kind":"ConfigMap","apiVersion":"v1","metadata":{"resourceVersion":"5","annotations":{"k8s.io/initial-events-end":"true"}}}}`+"\n")
			w.(http.Flusher).Flush()
		}
		<-r.Context().Done()
	}))
	t.Cleanup(u.Close)
	return u
}
