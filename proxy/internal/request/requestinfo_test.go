package request

import (
	"net/http"
	"net/url"
	"reflect"
	"testing"

	"k8s.io/apimachinery/pkg/util/sets"
	apiserver "k8s.io/apiserver/pkg/endpoints/request"
)

// TestSameAsAPIServer: the copy parses every request as kube-apiserver's
// own RequestInfoFactory does (the fields the copy keeps).
func TestSameAsAPIServer(t *testing.T) {
	for _, tc := range requestCases {
		ours, theirs := parseBoth(t, tc.method, tc.url)
		compare(t, tc.method+" "+tc.url, ours, theirs)
	}
}

// FuzzSameAsAPIServer: whatever the method and URL, the copy and the
// original agree.
func FuzzSameAsAPIServer(f *testing.F) {
	for _, tc := range requestCases {
		f.Add(tc.method, tc.url)
	}
	f.Fuzz(func(t *testing.T, method, rawURL string) {
		if _, err := url.Parse(rawURL); err != nil {
			return
		}
		ours, theirs := parseBoth(t, method, rawURL)
		compare(t, method+" "+rawURL, ours, theirs)
	})
}

var requestCases = []struct{ method, url string }{
	{http.MethodGet, "/api/v1/namespaces/demo/configmaps/cm"},
	{http.MethodGet, "/api/v1/configmaps?watch=true&labelSelector=a%3Db"},
	{http.MethodGet, "/api/v1/configmaps?watch=1&fieldSelector=metadata.name%3Dx"},
	{http.MethodGet, "/api/v1/configmaps?watch=nonsense&limit=x"},
	{http.MethodGet, "/api/v1/namespaces/demo/configmaps?fieldSelector=metadata.name%3Dlock"},
	{http.MethodGet, "/api/v1/namespaces/demo/configmaps?fieldSelector=metadata.name%3D..%2F"},
	{http.MethodGet, "/api/v1/watch/namespaces/demo/configmaps"},
	{http.MethodGet, "/api/v1/proxy/namespaces/demo/pods/p/x/y"},
	{http.MethodGet, "/api/v1/watch"},
	{http.MethodPost, "/apis/coordination.k8s.io/v1/namespaces/demo/leases"},
	{http.MethodPut, "/apis/coordination.k8s.io/v1/namespaces/demo/leases/lock"},
	{http.MethodPatch, "/apis/apps/v1/namespaces/demo/deployments/d/scale"},
	{http.MethodDelete, "/api/v1/namespaces/demo/configmaps"},
	{http.MethodDelete, "/api/v1/namespaces/demo"},
	{http.MethodPut, "/api/v1/namespaces/demo/finalize"},
	{http.MethodPut, "/api/v1/namespaces/demo/status"},
	{http.MethodHead, "/apis/apps/v1/deployments"},
	{"OPTIONS", "/apis/apps/v1/deployments"},
	{http.MethodGet, "/apis/apps"},
	{http.MethodGet, "/healthz"},
	{http.MethodGet, "/"},
	{http.MethodGet, "//api//v1///pods"},
}

func parseBoth(t *testing.T, method, rawURL string) (*RequestInfo, *apiserver.RequestInfo) {
	t.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		t.Fatal(err)
	}
	r := &http.Request{Method: method, URL: u}
	ours, ourErr := (&RequestInfoFactory{APIPrefixes: sets.New[string]("api", "apis"), GrouplessAPIPrefixes: sets.New[string]("api")}).NewRequestInfo(r)
	theirs, theirErr := (&apiserver.RequestInfoFactory{APIPrefixes: sets.NewString("api", "apis"), GrouplessAPIPrefixes: sets.NewString("api")}).NewRequestInfo(r)
	if (ourErr == nil) != (theirErr == nil) {
		t.Fatalf("%s %s: error %v, the API server's %v", method, rawURL, ourErr, theirErr)
	}
	return ours, theirs
}

func compare(t *testing.T, what string, ours *RequestInfo, theirs *apiserver.RequestInfo) {
	t.Helper()
	got := apiserver.RequestInfo{
		IsResourceRequest: ours.IsResourceRequest, Path: ours.Path, Verb: ours.Verb, APIPrefix: ours.APIPrefix, APIGroup: ours.APIGroup,
		APIVersion: ours.APIVersion, Namespace: ours.Namespace, Resource: ours.Resource, Subresource: ours.Subresource, Name: ours.Name, Parts: ours.Parts,
	}
	want := *theirs
	want.FieldSelector, want.LabelSelector = "", ""
	if len(got.Parts) == 0 && len(want.Parts) == 0 {
		got.Parts, want.Parts = nil, nil
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("%s:\n got %+v\nwant %+v", what, got, want)
	}
}
