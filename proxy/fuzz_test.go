package proxy

import (
	"encoding/json"
	"net/http"
	"net/url"
	"reflect"
	"strings"
	"testing"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/utils/ptr"

	ctrlmeshv1alpha1 "github.com/ctrlmesh/ctrlmesh/apis/ctrlmesh/v1alpha1"
	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/internal/request"
	"github.com/ctrlmesh/ctrlmesh/proxy/rules"
)

// requestInfo parses an API request the way the proxy does; it fails for
// what is not a URL or not an API path.
func requestInfo(method, rawURL string) (*request.RequestInfo, error) {
	infos := &request.RequestInfoFactory{APIPrefixes: sets.New[string]("api", "apis"), GrouplessAPIPrefixes: sets.New[string]("api")}
	req, err := http.NewRequest(method, rawURL, nil)
	if err != nil {
		return nil, err
	}
	return infos.NewRequestInfo(req)
}

func TestRenameNameSegment(t *testing.T) {
	tests := []struct {
		path, want string
	}{
		{"/apis/coordination.k8s.io/v1/namespaces/ops/leases/demo", "/apis/coordination.k8s.io/v1/namespaces/ops/leases/demo---3"},
		// The seed project's bug: a namespace spelled like the lock.
		{"/api/v1/namespaces/demo/configmaps/demo", "/api/v1/namespaces/demo/configmaps/demo---3"},
		{"/apis/coordination.k8s.io/v1/namespaces/leases/leases/demo", "/apis/coordination.k8s.io/v1/namespaces/leases/leases/demo---3"},
		{"/api/v1/watch/namespaces/demo/endpoints/demo", "/api/v1/watch/namespaces/demo/endpoints/demo---3"},
	}
	for _, tt := range tests {
		info, err := requestInfo(http.MethodGet, "https://h"+tt.path)
		if err != nil {
			t.Fatalf("%s: %v", tt.path, err)
		}
		got, err := renameNameSegment(tt.path, info.Parts, "demo", "demo---3")
		if err != nil || got != tt.want {
			t.Errorf("renameNameSegment(%s) = %q, %v; want %q", tt.path, got, err, tt.want)
		}
	}
}

// FuzzRenameNameSegment: renaming changes the object name and nothing else
// the API server reads from the path.
func FuzzRenameNameSegment(f *testing.F) {
	f.Add("coordination.k8s.io", "demo", "leases", "demo", "", false)
	f.Add("", "demo", "configmaps", "demo", "status", true)
	f.Add("", "leases", "endpoints", "leases", "", false)
	f.Fuzz(func(t *testing.T, group, namespace, resource, name, subresource string, legacyWatch bool) {
		for _, s := range []string{group, namespace, resource, name, subresource} {
			if strings.ContainsAny(s, "/?#%") {
				t.Skip("path segments cannot hold these")
			}
		}
		prefix := "/api/v1"
		if group != "" {
			prefix = "/apis/" + group + "/v1"
		}
		if legacyWatch {
			prefix += "/watch"
		}
		path := prefix
		if namespace != "" {
			path += "/namespaces/" + namespace
		}
		path += "/" + resource + "/" + name
		if subresource != "" {
			path += "/" + subresource
		}
		info, err := requestInfo(http.MethodGet, "https://h"+path)
		if err != nil {
			t.Skip("fuzz inputs that are not API paths say nothing about renaming")
		}
		if info.Name != name || name == "" {
			t.Skip("the path does not name an object the way it was meant to")
		}
		renamed, err := renameNameSegment(path, info.Parts, name, name+"---7")
		if err != nil {
			t.Fatalf("renaming %s: %v", path, err)
		}
		after, err := requestInfo(http.MethodGet, "https://h"+renamed)
		if err != nil {
			t.Fatalf("renamed path %s does not parse: %v", renamed, err)
		}
		if after.Name != name+"---7" || after.Namespace != info.Namespace || after.Resource != info.Resource ||
			after.Subresource != info.Subresource || after.APIGroup != info.APIGroup || after.Verb != info.Verb {
			t.Fatalf("%s -> %s: before %+v, after %+v", path, renamed, info, after)
		}
	})
}

func FuzzRenameFieldSelector(f *testing.F) {
	f.Add("metadata.name=demo")
	f.Add("metadata.name=demo,metadata.namespace=demo")
	f.Add("metadata.name!=demo")
	f.Fuzz(func(t *testing.T, selector string) {
		out, renamed, err := renameFieldSelector(selector, "demo", "demo---1")
		if err != nil {
			return
		}
		before, _ := fields.ParseSelector(selector)
		after, err := fields.ParseSelector(out)
		if err != nil {
			t.Fatalf("%q -> %q does not parse: %v", selector, out, err)
		}
		beforeReqs, afterReqs := before.Requirements(), after.Requirements()
		if len(beforeReqs) != len(afterReqs) {
			t.Fatalf("%q -> %q: terms added or lost", selector, out)
		}
		sawLock := false
		for i, b := range beforeReqs {
			a := afterReqs[i]
			isLock := b.Field == "metadata.name" && b.Value == "demo"
			sawLock = sawLock || isLock
			switch {
			case a.Field != b.Field || a.Operator != b.Operator:
				t.Fatalf("%q -> %q: term %d changed its field or operator", selector, out, i)
			case isLock && a.Value != "demo---1", !isLock && a.Value != b.Value:
				t.Fatalf("%q -> %q: term %d has value %q", selector, out, i, a.Value)
			}
		}
		if renamed != sawLock {
			t.Fatalf("%q: renamed = %v, but a lock term was there: %v", selector, renamed, sawLock)
		}
	})
}

// FuzzRenameJSONBody: metadata.name becomes the new name, everything else
// stays as it was.
func FuzzRenameJSONBody(f *testing.F) {
	f.Add(`{"apiVersion":"coordination.k8s.io/v1","kind":"Lease","metadata":{"name":"demo","namespace":"demo"},"spec":{"holderIdentity":"a"}}`)
	f.Add(`{"metadata":{"name":"demo","labels":{"name":"demo"}},"unknownField":[1,2]}`)
	var b bodyRenamer
	f.Fuzz(func(t *testing.T, body string) {
		out, err := b.rename("application/json", []byte(body), "demo---2")
		if err != nil {
			return
		}
		if name, err := b.name("application/json", out); err != nil || name != "demo---2" {
			t.Fatalf("renamed body %s has name %q (%v)", out, name, err)
		}
		var before, after map[string]any
		if json.Unmarshal([]byte(body), &before) != nil || json.Unmarshal(out, &after) != nil {
			t.Fatal("bodies do not decode")
		}
		before["metadata"].(map[string]any)["name"] = "demo---2"
		if !reflect.DeepEqual(before, after) {
			t.Fatalf("more than the name changed:\n%v\n%v", before, after)
		}
	})
}

// FuzzNarrow: whatever the client asks, the result keeps every requirement
// the client sent, adds the shard's and the limit's, and in range mode never
// reaches outside the shard.
func FuzzNarrow(f *testing.F) {
	f.Add(uint32(0xffff), "app=demo,ctrlmesh.io/sharding-hash in (1,2,20)", "", true)
	f.Add(uint32(0xff00ff00), "", "shardRange(object.metadata.namespace, '0x0000000000000000', '0x4000000000000000')", true)
	f.Add(uint32(1), "tier notin (a)", "", false)
	space := sharding.MustSpace(32)
	f.Fuzz(func(t *testing.T, mask uint32, labelSel, shardSel string, rangeMode bool) {
		var buckets []int
		for i := 0; i < 32; i++ {
			if mask&(1<<i) != 0 {
				buckets = append(buckets, i)
			}
		}
		if len(buckets) == 0 {
			t.Skip("a listed pod always owns something")
		}
		mode := rules.ModeLabel
		if rangeMode {
			mode = rules.ModeRange
		}
		route := &ctrlmeshv1alpha1.ShardRoute{Spec: ctrlmeshv1alpha1.ShardRouteSpec{
			RoutingGeneration: 1, RulesHash: "h", Buckets: 32,
			Limits: ctrlmeshv1alpha1.Limits{{RelateResources: []ctrlmeshv1alpha1.ResourceGroup{{APIGroups: []string{"*"}, Resources: []string{"*"}}}}},
			Shards: []ctrlmeshv1alpha1.RouteShard{{ID: "0", Buckets: mustSet(t, space, buckets).String(), Pods: []ctrlmeshv1alpha1.RoutePod{{Name: "p"}}}},
		}}
		snap, err := rules.Compile(route, "p", mode, nil)
		if err != nil {
			t.Fatal(err)
		}
		query := url.Values{}
		if labelSel != "" {
			query.Set("labelSelector", labelSel)
		}
		if shardSel != "" {
			query.Set("shardSelector", shardSel)
		}
		if _, err := snap.Narrow(query, &snap.Limits[0]); err != nil {
			return
		}
		// Range mode with no limit selector adds no label requirement and
		// leaves the client's labelSelector to the API server, byte for
		// byte; anything the proxy rewrote must parse.
		if mode == rules.ModeRange && len(snap.Limits[0].Requirements) == 0 {
			if query.Get("labelSelector") != labelSel {
				t.Fatalf("labelSelector %q changed to %q though nothing was added", labelSel, query.Get("labelSelector"))
			}
		}
		got, err := labels.Parse(query.Get("labelSelector"))
		if err != nil {
			if query.Get("labelSelector") == labelSel && mode == rules.ModeRange {
				return
			}
			t.Fatalf("narrowed labelSelector %q does not parse: %v", query.Get("labelSelector"), err)
		}
		gotReqs, _ := got.Requirements()
		if original, err := labels.Parse(labelSel); err == nil {
			origReqs, _ := original.Requirements()
			for _, r := range origReqs {
				if !containsReq(gotReqs, r) {
					t.Fatalf("client requirement %s lost: %q -> %q", r.String(), labelSel, got.String())
				}
			}
		}
		if mode == rules.ModeLabel {
			own, _ := snap.Ownership.LabelRequirements()
			for _, r := range own {
				if !containsReq(gotReqs, r) {
					t.Fatalf("shard requirement %s missing from %q", r.String(), got.String())
				}
			}
			return
		}
		ranges, err := sharding.ParseShardSelector(query.Get("shardSelector"))
		if err != nil {
			t.Fatalf("narrowed shardSelector %q does not parse: %v", query.Get("shardSelector"), err)
		}
		if inside := sharding.IntersectRanges(ranges, snap.Ownership.HashRanges()); !reflect.DeepEqual(inside, ranges) {
			t.Fatalf("shardSelector %q reaches outside the shard", query.Get("shardSelector"))
		}
	})
}

// containsReq reports whether reqs holds r. Values of a requirement are a
// set (labels.Requirement.Equal would compare their order, which differs
// between a built requirement and a parsed one).
func containsReq(reqs labels.Requirements, r labels.Requirement) bool {
	for _, x := range reqs {
		if x.Key() == r.Key() && x.Operator() == r.Operator() && x.Values().Equal(r.Values()) {
			return true
		}
	}
	return false
}

func mustSet(t *testing.T, s sharding.Space, buckets []int) sharding.Set {
	set, err := s.NewSet(buckets...)
	if err != nil {
		t.Fatal(err)
	}
	return set
}

// FuzzRenameProtobufBody: a Kubernetes protobuf body renamed decodes, as
// kube-apiserver decodes it, to the object it was with metadata.name the
// new name, and nothing else changed; the name read is the one the API
// server reads; a body that does not decode is refused, never passed on.
func FuzzRenameProtobufBody(f *testing.F) {
	// The reference: the typed codec of the lock kinds (and Namespaces,
	// whose creates the proxy fences by name).
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{coordinationv1.AddToScheme, corev1.AddToScheme} {
		if err := add(scheme); err != nil {
			f.Fatal(err)
		}
	}
	const protobuf = "application/vnd.kubernetes.protobuf"
	info, ok := runtime.SerializerInfoForMediaType(serializer.NewCodecFactory(scheme).SupportedMediaTypes(), protobuf)
	if !ok {
		f.Fatal("no protobuf serializer")
	}
	codec := info.Serializer
	var b bodyRenamer
	for _, obj := range []runtime.Object{
		&coordinationv1.Lease{TypeMeta: metav1.TypeMeta{APIVersion: "coordination.k8s.io/v1", Kind: "Lease"},
			ObjectMeta: metav1.ObjectMeta{Name: "demo", Namespace: "demo"}, Spec: coordinationv1.LeaseSpec{HolderIdentity: ptr.To("a")}},
		&corev1.ConfigMap{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "ConfigMap"},
			ObjectMeta: metav1.ObjectMeta{Name: "demo", Labels: map[string]string{"name": "demo"}}, Data: map[string]string{"k": "v"}},
		&corev1.Namespace{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Namespace"}, ObjectMeta: metav1.ObjectMeta{GenerateName: "x-"}},
	} {
		var sb strings.Builder
		if err := codec.Encode(obj, &sb); err != nil {
			f.Fatal(err)
		}
		f.Add([]byte(sb.String()))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		before, _, decodeErr := codec.Decode(body, nil, nil)
		if name, err := b.name(protobuf, body); err == nil && decodeErr == nil {
			acc, err := meta.Accessor(before)
			if err != nil {
				t.Fatal(err)
			}
			if name != acc.GetName() {
				t.Fatalf("name read %q, the API server reads %q", name, acc.GetName())
			}
		}
		out, err := b.rename(protobuf, body, "demo---2")
		if err != nil {
			return
		}
		if name, err := b.name(protobuf, out); err != nil || name != "demo---2" {
			t.Fatalf("renamed body has name %q (%v)", name, err)
		}
		after, _, err := codec.Decode(out, nil, nil)
		if decodeErr != nil {
			// Not an object the API server would take: what it does
			// with the renamed body is its to decide.
			return
		}
		if err != nil {
			t.Fatalf("the renamed body does not decode: %v", err)
		}
		acc, err := meta.Accessor(before)
		if err != nil {
			t.Fatal(err)
		}
		acc.SetName("demo---2")
		if !apiequality.Semantic.DeepEqual(before, after) {
			t.Fatalf("more than the name changed:\n%#v\n%#v", before, after)
		}
	})
}
