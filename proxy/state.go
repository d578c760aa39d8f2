package proxy

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"k8s.io/apimachinery/pkg/runtime/schema"
)

// What the proxy keeps in its state directory (Options.StateDir: an
// emptyDir only the proxy mounts, which lives as long as the pod), so that
// a proxy restarted alone — the sidecar container, its operator running on
// — carries on where the one before it stopped:
//
//   - the operator's client token (clientTokenFile), which the operator
//     read once at its start and goes on sending: a new one would leave it
//     answered 401 until it restarts too;
//   - under in-cluster interception, the CA the operator trusts (see
//     InterceptionState);
//   - the operator's streams that opened a watch (streamsFile): a new
//     proxy knows none of them, yet the operator's informers hold what the
//     proxy before served them, which may be a wider selection than the new
//     proxy's first rules. Those rules count as applied only once those
//     streams have relisted under them (selections.restore).
const streamsFile = "streams.json"

// loadClientToken returns the client token kept in dir, or makes one and
// keeps it there when dir holds none; with dir "" it makes one that lives
// as long as the process.
func loadClientToken(dir string) (string, error) {
	if dir != "" {
		token, err := os.ReadFile(filepath.Join(dir, clientTokenFile))
		switch {
		case err == nil && len(token) > 0:
			return string(token), nil
		case err == nil:
			return "", fmt.Errorf("the operator's client token in %s is empty: restart the pod to make a new one", filepath.Join(dir, clientTokenFile))
		case !errors.Is(err, os.ErrNotExist):
			return "", fmt.Errorf("reading the operator's client token: %w", err)
		}
	}
	token, err := newClientToken()
	if err != nil {
		return "", err
	}
	if dir != "" {
		if err := writeAtomic(filepath.Join(dir, clientTokenFile), []byte(token), 0o600); err != nil {
			return "", err
		}
	}
	return token, nil
}

// newClientToken makes a client token: 32 random bytes, in hex.
func newClientToken() (string, error) {
	secret := make([]byte, 32)
	if _, err := rand.Read(secret); err != nil {
		return "", fmt.Errorf("making the operator's client token: %w", err)
	}
	return hex.EncodeToString(secret), nil
}

// recordedStream is a selectionKey as streamsFile keeps it.
type recordedStream struct {
	Group         string `json:"group,omitempty"`
	Resource      string `json:"resource"`
	Namespace     string `json:"namespace,omitempty"`
	LabelSelector string `json:"labelSelector,omitempty"`
	FieldSelector string `json:"fieldSelector,omitempty"`
}

// streamRecord is the operator's watched streams, kept in streamsFile. It
// is rewritten whenever a stream opens its first watch, before the watch
// is served: a stream the record lacks would not be waited for by a
// restarted proxy.
type streamRecord struct {
	path string
	keys map[selectionKey]bool
}

// loadStreamRecord reads the streams a proxy before this one recorded in
// dir, or none when it holds no record. A record that does not parse is an
// error: the proxy cannot tell which of the operator's informers hold an
// earlier selection.
func loadStreamRecord(dir string) (*streamRecord, error) {
	r := &streamRecord{path: filepath.Join(dir, streamsFile), keys: map[selectionKey]bool{}}
	data, err := os.ReadFile(r.path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading the operator's recorded streams: %w", err)
	}
	var streams []recordedStream
	if err := json.Unmarshal(data, &streams); err != nil {
		return nil, fmt.Errorf("the operator's recorded streams in %s do not parse (%w): restart the pod, whose operator then starts afresh", r.path, err)
	}
	for _, s := range streams {
		r.keys[selectionKey{gr: schema.GroupResource{Group: s.Group, Resource: s.Resource},
			namespace: s.Namespace, labelSel: s.LabelSelector, fieldSel: s.FieldSelector}] = true
	}
	return r, nil
}

// add records key, rewriting the file when key is new. keep reports
// whether a recorded key is still worth keeping; the others are dropped
// at the rewrite.
func (r *streamRecord) add(key selectionKey, keep func(selectionKey) bool) error {
	if r.keys[key] {
		return nil
	}
	r.keys[key] = true
	streams := make([]recordedStream, 0, len(r.keys))
	for k := range r.keys {
		if k != key && !keep(k) {
			delete(r.keys, k)
			continue
		}
		streams = append(streams, recordedStream{Group: k.gr.Group, Resource: k.gr.Resource, Namespace: k.namespace,
			LabelSelector: k.labelSel, FieldSelector: k.fieldSel})
	}
	data, err := json.Marshal(streams)
	if err == nil {
		err = writeAtomic(r.path, data, 0o600)
	}
	if err != nil {
		delete(r.keys, key)
		return fmt.Errorf("recording the operator's watch of %s: %w", key.gr, err)
	}
	return nil
}
