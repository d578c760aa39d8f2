package proxy

import (
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/watchstream"
)

// ownNS and otherNS name namespaces inside and outside testProof. Every
// object of another shard in these tests lives in a namespace named
// "other-…", so a test can tell from the bytes handed on whether one got
// through.
func ownNS(i int) string   { return fmt.Sprintf("own-%d", i) }
func otherNS(i int) string { return fmt.Sprintf("other-%d", i) }

// testProof covers exactly the namespaces own-0 … own-63.
var testProof = func() shardProof {
	var ranges []sharding.HashRange
	for i := range 64 {
		h := sharding.Hash(ownNS(i))
		ranges = append(ranges, sharding.HashRange{First: h, Last: h})
	}
	slices.SortFunc(ranges, func(a, b sharding.HashRange) int { return cmp.Compare(a.First, b.First) })
	return shardProof{ranges: ranges}
}()

var testSelector = sharding.FormatShardSelector(testProof.ranges)

// configMaps returns one ConfigMap per namespace, with some bulk.
func configMaps(namespaces []string) []corev1.ConfigMap {
	out := make([]corev1.ConfigMap, len(namespaces))
	for i, ns := range namespaces {
		out[i] = corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i), Namespace: ns, Labels: map[string]string{"app": "demo"}},
			Data:       map[string]string{"x": strings.Repeat("x", 300), "tricky": `"}]{namespace":"other-9"`},
		}
	}
	return out
}

// typedJSON writes a list as kube-apiserver writes a typed list: kind,
// apiVersion, metadata (with shardInfo when selector is set), items.
func typedJSON(t testing.TB, kind string, selector string, items any) []byte {
	t.Helper()
	md := map[string]any{"resourceVersion": "7"}
	if selector != "" {
		md["shardInfo"] = map[string]any{"selector": selector}
	}
	mdJSON, _ := json.Marshal(md)
	itemsJSON, err := json.Marshal(items)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Appendf(nil, `{"kind":%q,"apiVersion":"v1","metadata":%s,"items":%s}`+"\n", kind, mdJSON, itemsJSON)
}

// unstructuredJSON writes a list as kube-apiserver writes a custom
// resource list: sorted keys, so the metadata comes after the items.
func unstructuredJSON(t testing.TB, selector string, cms []corev1.ConfigMap) []byte {
	t.Helper()
	list := &unstructured.UnstructuredList{Object: map[string]any{"apiVersion": "example.com/v1", "kind": "WidgetList"}}
	md := map[string]any{"resourceVersion": "7"}
	if selector != "" {
		md["shardInfo"] = map[string]any{"selector": selector}
	}
	list.Object["metadata"] = md
	for _, cm := range cms {
		raw, _ := json.Marshal(cm)
		var obj map[string]any
		_ = json.Unmarshal(raw, &obj)
		list.Items = append(list.Items, unstructured.Unstructured{Object: obj})
	}
	data, err := list.MarshalJSON()
	if err != nil {
		t.Fatal(err)
	}
	if i, j := bytes.Index(data, []byte(`"items"`)), bytes.Index(data, []byte(`"metadata":{"resourceVersion"`)); i < 0 || j < i {
		t.Fatalf("the unstructured list does not put its metadata after its items: %s", data)
	}
	return data
}

// protobufList writes a ConfigMapList as kube-apiserver does in protobuf:
// magic, runtime.Unknown{typeMeta, raw: list{ListMeta, items…}, "", ""}.
func protobufList(t testing.TB, selector string, cms []corev1.ConfigMap) []byte {
	t.Helper()
	var listMeta []byte
	listMeta = protowire.AppendTag(listMeta, 2, protowire.BytesType)
	listMeta = protowire.AppendString(listMeta, "7")
	if selector != "" {
		var shardInfo []byte
		shardInfo = protowire.AppendTag(shardInfo, 1, protowire.BytesType)
		shardInfo = protowire.AppendString(shardInfo, selector)
		listMeta = protowire.AppendTag(listMeta, 5, protowire.BytesType)
		listMeta = protowire.AppendBytes(listMeta, shardInfo)
	}
	var list []byte
	list = protowire.AppendTag(list, 1, protowire.BytesType)
	list = protowire.AppendBytes(list, listMeta)
	for i := range cms {
		item, err := cms[i].Marshal()
		if err != nil {
			t.Fatal(err)
		}
		list = protowire.AppendTag(list, 2, protowire.BytesType)
		list = protowire.AppendBytes(list, item)
	}
	var typeMeta []byte
	typeMeta = protowire.AppendTag(typeMeta, 1, protowire.BytesType)
	typeMeta = protowire.AppendString(typeMeta, "v1")
	typeMeta = protowire.AppendTag(typeMeta, 2, protowire.BytesType)
	typeMeta = protowire.AppendString(typeMeta, "ConfigMapList")
	out := bytes.Clone(protobufMagic)
	out = protowire.AppendTag(out, 1, protowire.BytesType)
	out = protowire.AppendBytes(out, typeMeta)
	out = protowire.AppendTag(out, 2, protowire.BytesType)
	out = protowire.AppendBytes(out, list)
	for _, field := range []protowire.Number{3, 4} {
		out = protowire.AppendTag(out, field, protowire.BytesType)
		out = protowire.AppendString(out, "")
	}
	return out
}

func namespaces(own, other int, otherFirst bool) []string {
	var owns, others []string
	for i := range own {
		owns = append(owns, ownNS(i))
	}
	for i := range other {
		others = append(others, otherNS(i))
	}
	if otherFirst {
		return append(others, owns...)
	}
	return append(owns, others...)
}

// TestCheckedBody: a range-mode list is handed on whole when its shardInfo
// proves the selector applied, or when every item is in the shard; it is
// refused before anything is handed on when the check finds an object
// outside the shard within the read-ahead, and cut short — never with that
// object — when it finds one later; what cannot be checked is refused.
func TestCheckedBody(t *testing.T) {
	const (
		jsonType  = "application/json"
		protoType = "application/vnd.kubernetes.protobuf"
	)
	outside := sharding.FormatShardSelector([]sharding.HashRange{{First: 0, Last: ^uint64(0)}})
	partial := func(cms []corev1.ConfigMap) []metav1.PartialObjectMetadata {
		var out []metav1.PartialObjectMetadata
		for _, cm := range cms {
			out = append(out, metav1.PartialObjectMetadata{TypeMeta: metav1.TypeMeta{Kind: "PartialObjectMetadata", APIVersion: "meta.k8s.io/v1"}, ObjectMeta: cm.ObjectMeta})
		}
		return out
	}
	tests := []struct {
		name, contentType string
		body              func(t *testing.T) []byte
		readAhead         int
		// want: "whole" (handed on unchanged), "refused" (refused before
		// anything is handed on), "cut" (ends with an error, nothing of
		// another shard handed on).
		want string
	}{
		{"typed JSON proven by shardInfo", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", testSelector, configMaps(namespaces(40, 0, false)))
		}, 64, "whole"},
		{"typed JSON, no shardInfo, every item in the shard", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", "", configMaps(namespaces(40, 0, false)))
		}, 64, "whole"},
		{"typed JSON, no shardInfo, another shard's object first", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", "", configMaps(namespaces(40, 3, true)))
		}, listCheckAhead, "refused"},
		{"typed JSON, no shardInfo, another shard's object after the read-ahead", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", "", configMaps(namespaces(40, 3, false)))
		}, 64, "cut"},
		{"typed JSON, shardInfo outside the selector sent", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", outside, configMaps(namespaces(4, 0, false)))
		}, listCheckAhead, "refused"},
		{"typed JSON, empty list with items null", jsonType, func(t *testing.T) []byte {
			return []byte(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{"resourceVersion":"7"},"items":null}`)
		}, listCheckAhead, "whole"},
		{"typed JSON, truncated", jsonType, func(t *testing.T) []byte {
			b := typedJSON(t, "ConfigMapList", "", configMaps(namespaces(4, 0, false)))
			return b[:len(b)-20]
		}, listCheckAhead, "refused"},
		{"typed JSON, an item's namespace spelled twice with different cases", jsonType, func(t *testing.T) []byte {
			// client-go reads "namespace" case-sensitively: other-1.
			return []byte(`{"kind":"ConfigMapList","apiVersion":"v1","metadata":{},"items":[{"metadata":{"namespace":"other-1","Namespace":"own-1"}}]}`)
		}, listCheckAhead, "refused"},
		{"metadata-only list, no shardInfo, every item in the shard", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "PartialObjectMetadataList", "", partial(configMaps(namespaces(10, 0, false))))
		}, 64, "whole"},
		{"metadata-only list, another shard's object", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "PartialObjectMetadataList", "", partial(configMaps(namespaces(10, 1, false))))
		}, listCheckAhead, "refused"},
		{"custom resources proven by shardInfo after the items", jsonType, func(t *testing.T) []byte {
			return unstructuredJSON(t, testSelector, configMaps(namespaces(40, 0, false)))
		}, 64, "whole"},
		{"custom resources with shardInfo after another shard's object", jsonType, func(t *testing.T) []byte {
			return unstructuredJSON(t, testSelector, configMaps(namespaces(40, 1, false)))
		}, 64, "cut"},
		{"custom resources, no shardInfo, another shard's object", jsonType, func(t *testing.T) []byte {
			return unstructuredJSON(t, "", configMaps(namespaces(2, 1, false)))
		}, listCheckAhead, "refused"},
		{"Table", jsonType, func(t *testing.T) []byte {
			return []byte(`{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"7"},"columnDefinitions":[],"rows":[{"cells":["x"],"object":{"metadata":{"namespace":"other-1"}}}]}`)
		}, listCheckAhead, "refused"},
		{"protobuf proven by shardInfo", protoType, func(t *testing.T) []byte {
			return protobufList(t, testSelector, configMaps(namespaces(40, 3, false)))
		}, 64, "whole"},
		{"protobuf, no shardInfo, every item in the shard", protoType, func(t *testing.T) []byte {
			return protobufList(t, "", configMaps(namespaces(40, 0, false)))
		}, 64, "whole"},
		{"protobuf, no shardInfo, another shard's object first", protoType, func(t *testing.T) []byte {
			return protobufList(t, "", configMaps(namespaces(40, 1, true)))
		}, listCheckAhead, "refused"},
		{"protobuf, no shardInfo, another shard's object after the read-ahead", protoType, func(t *testing.T) []byte {
			return protobufList(t, "", configMaps(namespaces(40, 1, false)))
		}, 64, "cut"},
		{"protobuf, shardInfo outside the selector sent", protoType, func(t *testing.T) []byte {
			return protobufList(t, outside, configMaps(namespaces(4, 0, false)))
		}, listCheckAhead, "refused"},
		{"protobuf, truncated", protoType, func(t *testing.T) []byte {
			b := protobufList(t, "", configMaps(namespaces(4, 0, false)))
			return b[:len(b)-10]
		}, listCheckAhead, "refused"},
		{"YAML", "application/yaml", func(t *testing.T) []byte { return []byte("items: []\n") }, listCheckAhead, "refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			body := tt.body(t)
			resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {tt.contentType}}, Body: io.NopCloser(bytes.NewReader(body))}
			var refusals []error
			checked, err := newCheckedBody(resp, testProof, func(err error) { refusals = append(refusals, err) }, nil)
			if err == nil {
				err = checked.readAhead(tt.readAhead)
			}
			if tt.want == "refused" {
				if err == nil {
					t.Fatal("not refused before anything was handed on")
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			out, err := io.ReadAll(checked)
			switch tt.want {
			case "whole":
				if err != nil || !bytes.Equal(out, body) {
					t.Fatalf("handed on %d of %d bytes, error %v", len(out), len(body), err)
				}
			case "cut":
				if err == nil || !errors.Is(err, errUnsharded) || len(refusals) != 1 {
					t.Fatalf("ended with %v after %d bytes (%d refusals), want the refusal", err, len(out), len(refusals))
				}
				if bytes.Contains(out, []byte(`"namespace":"other-`)) || bytes.Contains(out, []byte("\x1a\x07other-")) {
					t.Fatalf("handed on an object of another shard: %q", out)
				}
				if len(out) == 0 {
					t.Fatal("nothing handed on: the read-ahead should have passed the checked items on")
				}
			}
		})
	}
}

// TestCheckEvent: a range-mode watch hands on an ADDED, MODIFIED or
// DELETED event only for an object of the shard, in JSON and protobuf;
// bookmarks and errors pass; what it cannot read is refused.
func TestCheckEvent(t *testing.T) {
	jsonEvent := func(typ, kind, ns string) []byte {
		if kind == "Table" {
			// A Table's metadata is a ListMeta; its rows hold the objects.
			return fmt.Appendf(nil, `{"type":%q,"object":{"kind":"Table","apiVersion":"meta.k8s.io/v1","metadata":{"resourceVersion":"7"},"rows":[{"object":{"metadata":{"namespace":%q}}}]}}`+"\n", typ, ns)
		}
		return fmt.Appendf(nil, `{"type":%q,"object":{"kind":%q,"apiVersion":"v1","metadata":{"name":"x","namespace":%q}}}`+"\n", typ, kind, ns)
	}
	protoEvent := func(typ, kind, ns string) []byte {
		cm := corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "x", Namespace: ns}}
		object, err := cm.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		var typeMeta, unknown, raw, event []byte
		typeMeta = protowire.AppendTag(typeMeta, 2, protowire.BytesType)
		typeMeta = protowire.AppendString(typeMeta, kind)
		unknown = protowire.AppendTag(unknown, 1, protowire.BytesType)
		unknown = protowire.AppendBytes(unknown, typeMeta)
		unknown = protowire.AppendTag(unknown, 2, protowire.BytesType)
		unknown = protowire.AppendBytes(unknown, object)
		raw = protowire.AppendTag(raw, 1, protowire.BytesType)
		raw = protowire.AppendBytes(raw, append(bytes.Clone(protobufMagic), unknown...))
		event = protowire.AppendTag(event, 1, protowire.BytesType)
		event = protowire.AppendString(event, typ)
		event = protowire.AppendTag(event, 2, protowire.BytesType)
		event = protowire.AppendBytes(event, raw)
		return append([]byte{0, 0, byte(len(event) >> 8), byte(len(event))}, event...)
	}
	for _, tc := range []struct {
		typ, kind, ns string
		ok            bool
	}{
		{"ADDED", "ConfigMap", ownNS(1), true},
		{"MODIFIED", "ConfigMap", ownNS(2), true},
		{"DELETED", "ConfigMap", ownNS(3), true},
		{"ADDED", "ConfigMap", otherNS(1), false},
		{"MODIFIED", "ConfigMap", otherNS(1), false},
		{"DELETED", "ConfigMap", otherNS(1), false},
		{"ADDED", "ConfigMap", "", false},
		{"ADDED", "Table", ownNS(1), false},
		{"BOOKMARK", "ConfigMap", "", true},
		{"ERROR", "Status", "", true},
		{"SURPRISE", "ConfigMap", ownNS(1), false},
	} {
		for framing, frame := range map[watchstream.Framing][]byte{
			watchstream.JSON:     jsonEvent(tc.typ, tc.kind, tc.ns),
			watchstream.Protobuf: protoEvent(tc.typ, tc.kind, tc.ns),
		} {
			if err := testProof.checkEvent(framing, frame); (err == nil) != tc.ok {
				t.Errorf("%v %s of a %s in %q: %v, want allowed %v", framing, tc.typ, tc.kind, tc.ns, err, tc.ok)
			}
		}
	}
	// client-go reads "namespace" case-sensitively: other-1.
	if err := testProof.checkEvent(watchstream.JSON, []byte(`{"type":"ADDED","object":{"metadata":{"namespace":"other-1","Namespace":"own-1"}}}`)); err == nil {
		t.Error("an event whose namespace is spelled twice with different cases was let through")
	}
	for framing, frame := range map[watchstream.Framing][]byte{
		watchstream.JSON:     []byte(`{"type":"ADDED","object":`),
		watchstream.Protobuf: {0, 0, 0, 9, 0xff, 0xff},
	} {
		if err := testProof.checkEvent(framing, frame); err == nil {
			t.Errorf("%v: a malformed event was let through", framing)
		}
	}
}

// FuzzCheckedBody: whatever a list response holds — lists of both shards'
// objects in JSON (typed and unstructured) and protobuf, mutated at will —
// the bytes handed on never hold an object of another shard's namespace,
// before an error or without one. The lists carry no shardInfo: their items
// are the only proof.
func FuzzCheckedBody(f *testing.F) {
	cms := func(ns []string) []corev1.ConfigMap {
		out := configMaps(ns)
		for i := range out {
			out[i].Data["tricky"] = `"}]{"`
		}
		return out
	}
	f.Add(typedJSON(f, "ConfigMapList", "", cms(namespaces(3, 2, false))), false, uint16(40))
	f.Add(typedJSON(f, "ConfigMapList", "", cms(namespaces(3, 0, false))), false, uint16(0))
	f.Add(unstructuredJSON(f, "", cms(namespaces(2, 1, false))), false, uint16(100))
	f.Add(protobufList(f, "", cms(namespaces(3, 2, false))), true, uint16(40))
	f.Add(protobufList(f, "", cms(namespaces(3, 0, true))), true, uint16(0))
	f.Fuzz(func(t *testing.T, body []byte, proto bool, ahead uint16) {
		contentType := "application/json"
		if proto {
			contentType = "application/vnd.kubernetes.protobuf"
		}
		resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {contentType}}, Body: io.NopCloser(bytes.NewReader(body))}
		checked, err := newCheckedBody(resp, testProof, func(error) {}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if err := checked.readAhead(int(ahead)); err != nil {
			return
		}
		out, _ := io.ReadAll(checked)
		if bytes.Contains(out, []byte("other-")) && !bytes.Contains(body, []byte("shardInfo")) {
			t.Fatalf("handed on an object of another shard: %q", out)
		}
	})
}
