package proxy

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/metadata"
	"k8s.io/client-go/rest"

	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// namespaceView follows the labels of the upstream's Namespaces for
// isolation, with the operator's credentials (which must allow list and
// watch of namespaces). It confirms a namespace's labels only while it
// holds a list and the watch that followed it: before the first list, and
// from a failed list or watch until the next list succeeds, it confirms
// none, and isolation then leaves the pod no namespace (fail closed).
type namespaceView struct {
	client  metadata.ResourceInterface
	log     logr.Logger
	changed func()
	retry   time.Duration

	startOnce sync.Once
	mu        sync.Mutex
	labels    map[string]map[string]string
	confirmed bool
}

func newNamespaceView(upstream *rest.Config, log logr.Logger, changed func()) (*namespaceView, error) {
	// Only the labels matter: the metadata client reads them without
	// linking the typed API of every group into the sidecar.
	mc, err := metadata.NewForConfig(upstream)
	if err != nil {
		return nil, fmt.Errorf("namespace client: %w", err)
	}
	return &namespaceView{client: mc.Resource(schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}), log: log, changed: changed, retry: time.Second}, nil
}

// start runs the view until stopped closes, once.
func (v *namespaceView) start(stopped <-chan struct{}) {
	v.startOnce.Do(func() {
		ctx, cancel := context.WithCancel(context.Background())
		go func() {
			<-stopped
			cancel()
		}()
		go v.run(ctx)
	})
}

// inside returns the namespaces iso admits, and whether the view confirms
// any at all.
func (v *namespaceView) inside(iso *rules.Isolation) ([]string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if !v.confirmed {
		return nil, false
	}
	var out []string
	for name, l := range v.labels {
		if iso.Admits(name, l) {
			out = append(out, name)
		}
	}
	return out, true
}

func (v *namespaceView) run(ctx context.Context) {
	for ctx.Err() == nil {
		err := v.listAndWatch(ctx)
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errWatch) {
			// A failed watch (an expired resourceVersion, a restarted API
			// server) is followed by a list at once: the labels are no
			// staler meanwhile than an informer's. Only a failed list
			// leaves them unconfirmed.
			v.log.V(1).Info("relisting namespaces", "reason", err.Error())
			continue
		}
		v.unconfirm(err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(v.retry):
		}
	}
}

// errWatch marks a failed watch, after which the view lists again.
var errWatch = errors.New("watching namespaces")

// listAndWatch lists the Namespaces and follows them until a watch cannot
// be (re-)established or fails (errWatch).
func (v *namespaceView) listAndWatch(ctx context.Context) error {
	list, err := v.client.List(ctx, metav1.ListOptions{})
	if err != nil {
		return fmt.Errorf("listing namespaces: %w", err)
	}
	next := make(map[string]map[string]string, len(list.Items))
	for i := range list.Items {
		next[list.Items[i].Name] = labelsOf(&list.Items[i])
	}
	v.mu.Lock()
	v.labels, v.confirmed = next, true
	v.mu.Unlock()
	v.changed()
	rv := list.ResourceVersion
	for {
		w, err := v.client.Watch(ctx, metav1.ListOptions{ResourceVersion: rv, AllowWatchBookmarks: true})
		if err != nil {
			return fmt.Errorf("%w: %w", errWatch, err)
		}
		if rv, err = v.follow(w, rv); err != nil {
			return err
		}
	}
}

// follow applies one watch's events until it ends, and returns the last
// resourceVersion seen, or errWatch when the watch failed.
func (v *namespaceView) follow(w watch.Interface, rv string) (string, error) {
	defer w.Stop()
	for ev := range w.ResultChan() {
		if ev.Type == watch.Error {
			return "", fmt.Errorf("%w: %v", errWatch, ev.Object)
		}
		ns, ok := ev.Object.(*metav1.PartialObjectMetadata)
		if !ok {
			return "", fmt.Errorf("%w: unexpected %T", errWatch, ev.Object)
		}
		rv = ns.ResourceVersion
		switch ev.Type {
		case watch.Added, watch.Modified:
			v.set(ns.Name, labelsOf(ns))
		case watch.Deleted:
			v.set(ns.Name, nil)
		}
	}
	return rv, nil
}

// labelsOf is ns's labels, never nil: nil stands for a deleted namespace.
func labelsOf(ns *metav1.PartialObjectMetadata) map[string]string {
	if ns.Labels == nil {
		return map[string]string{}
	}
	return ns.Labels
}

// set records a namespace's labels; nil removes it.
func (v *namespaceView) set(name string, l map[string]string) {
	v.mu.Lock()
	if l == nil {
		delete(v.labels, name)
	} else {
		v.labels[name] = l
	}
	v.mu.Unlock()
	v.changed()
}

func (v *namespaceView) unconfirm(err error) {
	v.mu.Lock()
	was := v.confirmed
	v.labels, v.confirmed = nil, false
	v.mu.Unlock()
	if was {
		v.log.Error(err, "cannot confirm the namespaces' labels: isolation leaves this pod no namespace until it can; the operator's ServiceAccount needs list and watch on namespaces")
	}
	v.changed()
}
