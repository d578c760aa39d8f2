package proxy

import (
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

// benchConfigMaps returns n ConfigMaps shaped like proxybench's (a 256-byte
// payload) with the metadata kube-apiserver fills in: uid,
// resourceVersion, creationTimestamp, one managedFields entry.
func benchConfigMaps(n int) []corev1.ConfigMap {
	created := metav1.NewTime(time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC))
	out := make([]corev1.ConfigMap, n)
	for i := range out {
		out[i] = corev1.ConfigMap{
			ObjectMeta: metav1.ObjectMeta{
				Name: fmt.Sprintf("cm-%04d", i), Namespace: ownNS(i % 64),
				UID:               types.UID(fmt.Sprintf("4f0c6a1e-8d2b-4c1e-9a7f-%012d", i)),
				ResourceVersion:   strconv.Itoa(100000 + i),
				CreationTimestamp: created,
				ManagedFields: []metav1.ManagedFieldsEntry{{
					Manager: "proxybench", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", Time: &created,
					FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{".":{},"f:payload":{}}}`)},
				}},
			},
			Data: map[string]string{"payload": strings.Repeat("x", 256)},
		}
	}
	return out
}

// BenchmarkCheckList measures checkList on a range-mode LIST of 1,000
// ConfigMaps, including handing the body on (read to its end, as
// ReverseProxy copies it): proven by shardInfo (a server with the
// ShardedListAndWatch gate, proxybench's case) and checked item by item
// (no shardInfo), in protobuf and JSON, plain and gzip-compressed at
// kube-apiserver's level (1).
func BenchmarkCheckList(b *testing.B) {
	items := benchConfigMaps(1000)
	for _, proof := range []struct{ name, selector string }{{"shardInfo", testSelector}, {"items", ""}} {
		for _, format := range []struct {
			name, contentType string
			body              []byte
		}{
			{"protobuf", "application/vnd.kubernetes.protobuf", protobufList(b, proof.selector, items)},
			{"json", "application/json", typedJSON(b, "ConfigMapList", proof.selector, items)},
		} {
			for _, compressed := range []bool{false, true} {
				body, encoding := format.body, "identity"
				if compressed {
					var buf bytes.Buffer
					zw, _ := gzip.NewWriterLevel(&buf, 1)
					if _, err := zw.Write(body); err != nil {
						b.Fatal(err)
					}
					if err := zw.Close(); err != nil {
						b.Fatal(err)
					}
					body, encoding = buf.Bytes(), "gzip"
				}
				b.Run(fmt.Sprintf("%s/%s/%s", proof.name, format.name, encoding), func(b *testing.B) {
					b.ReportAllocs()
					b.SetBytes(int64(len(body)))
					refused := func(err error) { b.Fatalf("refused: %v", err) }
					proof := shardProof{ranges: testProof.ranges, sent: testSelector}
					for b.Loop() {
						header := http.Header{"Content-Type": {format.contentType}, "Content-Length": {strconv.Itoa(len(body))}}
						if compressed {
							header.Set("Content-Encoding", "gzip")
						}
						resp := &http.Response{StatusCode: http.StatusOK, ContentLength: int64(len(body)), Header: header, Body: io.NopCloser(bytes.NewReader(body))}
						if err := checkList(resp, proof, refused); err != nil {
							b.Fatal(err)
						}
						if _, err := io.Copy(io.Discard, resp.Body); err != nil {
							b.Fatal(err)
						}
						_ = resp.Body.Close()
					}
				})
			}
		}
	}
}
