package proxy

import (
	"bytes"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"

	"github.com/ctrlmesh/ctrlmesh/proxy/watchstream"
)

// encodeEvent frames ev as kube-apiserver's watch handler does, with
// client-go's encoders, in framing.
func encodeEvent(t *testing.T, framing watchstream.Framing, ev watch.Event) []byte {
	t.Helper()
	mediaType := map[watchstream.Framing]string{watchstream.JSON: runtime.ContentTypeJSON, watchstream.Protobuf: runtime.ContentTypeProtobuf}[framing]
	codecs := serializer.NewCodecFactory(scheme.Scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mediaType)
	if !ok || info.StreamSerializer == nil {
		t.Fatalf("no stream serializer for %s", mediaType)
	}
	embedded := codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion)
	var buf bytes.Buffer
	enc := restclientwatch.NewEncoder(streaming.NewEncoder(info.StreamSerializer.Framer.NewFrameWriter(&buf), info.StreamSerializer.Serializer), embedded)
	if err := enc.Encode(&ev); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestInitialEventsEnd(t *testing.T) {
	annotated := func(value string) *corev1.ConfigMap {
		return &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "42", Annotations: map[string]string{metav1.InitialEventsAnnotationKey: value}}}
	}
	for _, tc := range []struct {
		name string
		ev   watch.Event
		want bool
	}{
		{"the bookmark that ends the initial events", watch.Event{Type: watch.Bookmark, Object: annotated("true")}, true},
		{"a bookmark saying false", watch.Event{Type: watch.Bookmark, Object: annotated("false")}, false},
		{"a plain bookmark", watch.Event{Type: watch.Bookmark, Object: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "42"}}}, false},
		{"a bookmark with other annotations", watch.Event{Type: watch.Bookmark, Object: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{ResourceVersion: "42",
			Annotations: map[string]string{"a": "b", metav1.InitialEventsAnnotationKey + "x": "true"}}}}, false},
		{"an object annotated as the bookmark", watch.Event{Type: watch.Added, Object: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "c",
			Annotations: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}}, false},
		{"an object holding the annotation's key", watch.Event{Type: watch.Modified, Object: &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "n", Name: "c"},
			Data: map[string]string{metav1.InitialEventsAnnotationKey: "true"}}}, false},
	} {
		for _, framing := range []watchstream.Framing{watchstream.JSON, watchstream.Protobuf} {
			if got := initialEventsEnd(framing, encodeEvent(t, framing, tc.ev)); got != tc.want {
				t.Errorf("%s, %v: %v, want %v", tc.name, framing, got, tc.want)
			}
		}
	}
	end := encodeEvent(t, watchstream.Protobuf, watch.Event{Type: watch.Bookmark, Object: annotated("true")})
	for name, frame := range map[string][]byte{
		"JSON cut short":      []byte(`{"type":"BOOKMARK","object":{"metadata":{"annotations":{"k8s.io/initial-events-end":"tr`),
		"protobuf cut short":  end[:len(end)-3],
		"protobuf no prefix":  end[:3],
		"protobuf bad length": append([]byte{0, 0, 0, 1, 0xff}, end[5:]...),
	} {
		framing := watchstream.Protobuf
		if name == "JSON cut short" {
			framing = watchstream.JSON
		}
		if initialEventsEnd(framing, frame) {
			t.Errorf("%s: read as the end of the initial events", name)
		}
	}
}
