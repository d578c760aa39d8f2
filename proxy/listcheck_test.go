package proxy

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
)

// gzipped compresses data as kube-apiserver does (level 1).
func gzipped(t testing.TB, data []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := zw.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// TestCheckListGzipReuse: the gzip decoders and buffers checkList reuses
// carry nothing from one list to the next. Lists that fail — not gzip,
// gzip cut short or corrupted within the read-ahead, refused by the check
// — alternate with good ones, over enough rounds that the pool hands a
// decoder that failed to a good list: every failing list is refused before
// anything is handed on, and every good list goes on whole: compressed as
// sent, or decoded when it is checked item by item beyond the read-ahead.
func TestCheckListGzipReuse(t *testing.T) {
	const protoType = "application/vnd.kubernetes.protobuf"
	good := gzipped(t, protobufList(t, testSelector, configMaps(namespaces(40, 0, false))))
	goodItems := gzipped(t, typedJSON(t, "ConfigMapList", "", configMaps(namespaces(40, 0, false))))
	otherFirst := gzipped(t, protobufList(t, "", configMaps(namespaces(3, 2, true))))
	corrupted := bytes.Clone(good)
	for i := 20; i < len(corrupted)-8; i += 7 {
		corrupted[i] ^= 0x5a
	}
	failing := []struct {
		name, contentType string
		body              []byte
	}{
		{"not gzip", protoType, []byte("k8s\x00 not gzip at all")},
		{"gzip cut short", "application/json", goodItems[:len(goodItems)/2]},
		{"gzip corrupted", protoType, corrupted},
		{"another shard's object first", protoType, otherFirst},
	}
	// Beyond the read-ahead, a list without shardInfo goes on decoded.
	var own []string
	for i := range 1500 {
		own = append(own, ownNS(i%64))
	}
	largePlain := protobufList(t, "", configMaps(own))
	if len(largePlain) <= listCheckAhead {
		t.Fatalf("a list of %d bytes does not outgrow the read-ahead", len(largePlain))
	}
	goods := []struct {
		contentType string
		body, want  []byte
	}{{protoType, good, good}, {"application/json", goodItems, goodItems}, {protoType, gzipped(t, largePlain), largePlain}}
	list := func(contentType string, body []byte) (*http.Response, []error, error) {
		resp := &http.Response{StatusCode: http.StatusOK, ContentLength: int64(len(body)), Header: http.Header{
			"Content-Type": {contentType}, "Content-Encoding": {"gzip"}, "Content-Length": {strconv.Itoa(len(body))},
		}, Body: io.NopCloser(bytes.NewReader(body))}
		var refusals []error
		err := checkList(resp, testProof, func(err error) { refusals = append(refusals, err) })
		return resp, refusals, err
	}
	for round := range 20 {
		for _, f := range failing {
			if _, refusals, err := list(f.contentType, f.body); err == nil || len(refusals) != 1 {
				t.Fatalf("round %d, %s: error %v, %d refusals: want the list refused before anything was handed on", round, f.name, err, len(refusals))
			}
			g := goods[round%len(goods)]
			resp, refusals, err := list(g.contentType, g.body)
			if err != nil || len(refusals) != 0 {
				t.Fatalf("round %d, a good list after %s: error %v, %d refusals", round, f.name, err, len(refusals))
			}
			out, err := io.ReadAll(resp.Body)
			if err != nil || !bytes.Equal(out, g.want) {
				t.Fatalf("round %d, a good list after %s: handed on %d bytes (Content-Encoding %q, error %v), want the %d bytes of the list",
					round, f.name, len(out), resp.Header.Get("Content-Encoding"), err, len(g.want))
			}
		}
	}
}

// TestShardProofApplied: a shardInfo echo identical to the selector sent
// proves the list without parsing; any other echo is parsed and must
// select nothing outside the ranges sent; an empty echo never matches,
// even a proof that records no selector sent.
func TestShardProofApplied(t *testing.T) {
	sent := shardProof{ranges: testProof.ranges, sent: testSelector}
	whole := sharding.FormatShardSelector([]sharding.HashRange{{First: 0, Last: ^uint64(0)}})
	narrower := sharding.FormatShardSelector(testProof.ranges[:3])
	tests := []struct {
		name    string
		proof   shardProof
		echoed  string
		wantErr bool
	}{
		{"the selector sent, echoed", sent, testSelector, false},
		{"the selector sent, echoed, without the selector sent recorded", testProof, testSelector, false},
		{"the selector sent, echoed with other spacing", sent, strings.ReplaceAll(testSelector, " || ", "||"), false},
		{"a narrower selector", sent, narrower, false},
		{"the whole space", sent, whole, true},
		{"the selector sent and one more range", sent, testSelector + " || " + whole, true},
		{"empty", sent, "", true},
		{"empty, without the selector sent recorded", testProof, "", true},
		{"garbage", sent, "shardRange(", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, applied := range []func(string) error{tt.proof.applied, func(s string) error { return tt.proof.appliedBytes([]byte(s)) }} {
				err := applied(tt.echoed)
				if (err != nil) != tt.wantErr {
					t.Fatalf("applied(%q) = %v, want error: %v", tt.echoed, err, tt.wantErr)
				}
				if tt.wantErr && tt.echoed == whole && !errors.Is(err, errUnsharded) {
					t.Fatalf("applied(%q) = %v, want errUnsharded", tt.echoed, err)
				}
			}
		})
	}
}
