package proxy

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// TestCheckListGzip: a gzip-compressed range-mode list the operator
// accepted compressed goes on as the API server sent it — byte for byte,
// still gzip — once proven within the read-ahead (by shardInfo, or every
// item checked to the end); a list that is checked item by item beyond the
// read-ahead goes on decoded and plain, cut short before another shard's
// object; a refusal within the read-ahead, or a body that is not gzip,
// refuses the list before anything is handed on.
func TestCheckListGzip(t *testing.T) {
	const (
		jsonType  = "application/json"
		protoType = "application/vnd.kubernetes.protobuf"
	)
	// many returns n namespaces of the shard, then other of another shard:
	// enough of them to outgrow the read-ahead.
	many := func(n, other int) []string {
		var out []string
		for i := range n {
			out = append(out, ownNS(i%64))
		}
		for i := range other {
			out = append(out, otherNS(i))
		}
		return out
	}
	outside := sharding.FormatShardSelector([]sharding.HashRange{{First: 0, Last: ^uint64(0)}})
	tests := []struct {
		name, contentType string
		body              func(t *testing.T) []byte
		// want: "compressed" (the gzip bytes handed on unchanged),
		// "decoded" (the list handed on whole, plain), "cut" (plain, ends
		// with the refusal, nothing of another shard handed on), "refused"
		// (before anything is handed on).
		want string
	}{
		{"typed JSON proven by shardInfo, larger than the read-ahead", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", testSelector, configMaps(many(1500, 0)))
		}, "compressed"},
		{"protobuf proven by shardInfo, larger than the read-ahead", protoType, func(t *testing.T) []byte {
			return protobufList(t, testSelector, configMaps(many(1500, 0)))
		}, "compressed"},
		{"no shardInfo, every item in the shard, within the read-ahead", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", "", configMaps(many(40, 0)))
		}, "compressed"},
		{"no shardInfo, every item in the shard, larger than the read-ahead", protoType, func(t *testing.T) []byte {
			return protobufList(t, "", configMaps(many(1500, 0)))
		}, "decoded"},
		{"no shardInfo, another shard's object after the read-ahead", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", "", configMaps(many(1500, 2)))
		}, "cut"},
		{"no shardInfo, another shard's object first", protoType, func(t *testing.T) []byte {
			return protobufList(t, "", configMaps(namespaces(3, 2, true)))
		}, "refused"},
		{"shardInfo outside the selector sent", jsonType, func(t *testing.T) []byte {
			return typedJSON(t, "ConfigMapList", outside, configMaps(many(40, 0)))
		}, "refused"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			plain := tt.body(t)
			var compressed bytes.Buffer
			zw := gzip.NewWriter(&compressed)
			if _, err := zw.Write(plain); err != nil {
				t.Fatal(err)
			}
			if err := zw.Close(); err != nil {
				t.Fatal(err)
			}
			resp := &http.Response{StatusCode: http.StatusOK, ContentLength: int64(compressed.Len()), Header: http.Header{
				"Content-Type": {tt.contentType}, "Content-Encoding": {"gzip"}, "Content-Length": {strconv.Itoa(compressed.Len())},
			}, Body: io.NopCloser(bytes.NewReader(compressed.Bytes()))}
			var refusals []error
			err := checkList(resp, testProof, func(err error) { refusals = append(refusals, err) })
			if tt.want == "refused" {
				if err == nil || len(refusals) != 1 {
					t.Fatalf("error %v, %d refusals: want the list refused before anything was handed on", err, len(refusals))
				}
				return
			}
			if err != nil {
				t.Fatalf("refused: %v", err)
			}
			out, err := io.ReadAll(resp.Body)
			encoding := resp.Header.Get("Content-Encoding")
			switch tt.want {
			case "compressed":
				if err != nil || encoding != "gzip" || !bytes.Equal(out, compressed.Bytes()) || resp.ContentLength != int64(compressed.Len()) {
					t.Fatalf("handed on %d bytes (Content-Encoding %q, length %d, error %v), want the %d compressed bytes as sent",
						len(out), encoding, resp.ContentLength, err, compressed.Len())
				}
			case "decoded":
				if err != nil || encoding != "" || resp.Header.Get("Content-Length") != "" || resp.ContentLength != -1 || !bytes.Equal(out, plain) {
					t.Fatalf("handed on %d of %d bytes (Content-Encoding %q, length %d, error %v), want the list whole and plain",
						len(out), len(plain), encoding, resp.ContentLength, err)
				}
			case "cut":
				if encoding != "" || err == nil || !errors.Is(err, errUnsharded) || len(refusals) != 1 {
					t.Fatalf("ended with %v after %d bytes (Content-Encoding %q, %d refusals), want plain bytes and the refusal", err, len(out), encoding, len(refusals))
				}
				if len(out) < listCheckAhead || bytes.Contains(out, []byte(`"namespace":"other-`)) {
					t.Fatalf("handed on %d bytes, want the checked items and no object of another shard", len(out))
				}
			}
		})
	}
	// Not gzip although it says so.
	resp := &http.Response{StatusCode: http.StatusOK, Header: http.Header{"Content-Type": {jsonType}, "Content-Encoding": {"gzip"}},
		Body: io.NopCloser(bytes.NewReader(typedJSON(t, "ConfigMapList", testSelector, configMaps(many(4, 0)))))}
	if err := checkList(resp, testProof, func(error) {}); err == nil {
		t.Error("a body that is not gzip was handed on")
	}
}

// TestAcceptsGzip: only a plain gzip coding counts.
func TestAcceptsGzip(t *testing.T) {
	for _, tc := range []struct {
		values []string
		want   bool
	}{
		{[]string{"gzip"}, true},
		{[]string{"deflate, GZIP"}, true},
		{[]string{"br", "gzip"}, true},
		{nil, false},
		{[]string{"identity"}, false},
		{[]string{"gzip;q=0"}, false},
		{[]string{"x-gzip"}, false},
	} {
		if got := acceptsGzip(tc.values); got != tc.want {
			t.Errorf("acceptsGzip(%q) = %v, want %v", tc.values, got, tc.want)
		}
	}
}

// FuzzCheckListGzip: whatever a gzip-compressed list holds, what the
// operator decodes from the bytes handed on — compressed as sent, or
// decoded — never holds an object of another shard's namespace unless the
// list carried a shardInfo.
func FuzzCheckListGzip(f *testing.F) {
	// As FuzzCheckedBody's: no "other-" but in another shard's namespaces.
	cms := func(ns []string) []corev1.ConfigMap {
		out := configMaps(ns)
		for i := range out {
			out[i].Data["tricky"] = `"}]{"`
		}
		return out
	}
	f.Add(typedJSON(f, "ConfigMapList", "", cms(namespaces(3, 2, false))), false)
	f.Add(typedJSON(f, "ConfigMapList", "", cms(namespaces(3, 0, false))), false)
	f.Add(protobufList(f, "", cms(namespaces(3, 2, false))), true)
	f.Add(protobufList(f, testSelector, cms(namespaces(3, 0, true))), true)
	f.Fuzz(func(t *testing.T, body []byte, proto bool) {
		contentType := "application/json"
		if proto {
			contentType = "application/vnd.kubernetes.protobuf"
		}
		var compressed bytes.Buffer
		zw := gzip.NewWriter(&compressed)
		_, _ = zw.Write(body)
		_ = zw.Close()
		resp := &http.Response{StatusCode: http.StatusOK, ContentLength: -1, Header: http.Header{"Content-Type": {contentType}, "Content-Encoding": {"gzip"}},
			Body: io.NopCloser(bytes.NewReader(compressed.Bytes()))}
		if err := checkList(resp, testProof, func(error) {}); err != nil {
			return
		}
		out, _ := io.ReadAll(resp.Body)
		if resp.Header.Get("Content-Encoding") == "gzip" {
			zr, err := gzip.NewReader(bytes.NewReader(out))
			if err != nil {
				t.Fatalf("handed on as gzip, but not gzip: %v", err)
			}
			if out, err = io.ReadAll(zr); err != nil {
				t.Fatalf("handed on as gzip, but does not decode: %v", err)
			}
		}
		if bytes.Contains(out, []byte("other-")) && !bytes.Contains(body, []byte("shardInfo")) {
			t.Fatalf("handed on an object of another shard: %q", out)
		}
	})
}
