package watchstream

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"runtime"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	k8sruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/streaming"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/scheme"
	restclientwatch "k8s.io/client-go/rest/watch"
)

// contentType is the Content-Type kube-apiserver sets on a watch response
// of that framing (seen on the wire: see TestInformerRelistsThroughProxy).
func contentType(f Framing) string {
	if f == Protobuf {
		return "application/vnd.kubernetes.protobuf;stream=watch"
	}
	return "application/json"
}

// encodeEvent encodes one watch event the way kube-apiserver does
// (handlers.watchEncoder): the object with the media type's serializer, the
// metav1.WatchEvent with its stream serializer, through its framer.
func encodeEvent(tb testing.TB, framing Framing, typ watch.EventType, obj k8sruntime.Object) []byte {
	tb.Helper()
	mediaType, _, err := mime.ParseMediaType(contentType(framing))
	if err != nil {
		tb.Fatal(err)
	}
	info, ok := k8sruntime.SerializerInfoForMediaType(scheme.Codecs.SupportedMediaTypes(), mediaType)
	if !ok {
		tb.Fatalf("no serializer for %s", mediaType)
	}
	var raw bytes.Buffer
	if err := scheme.Codecs.EncoderForVersion(info.Serializer, corev1.SchemeGroupVersion).Encode(obj, &raw); err != nil {
		tb.Fatal(err)
	}
	var event bytes.Buffer
	err = scheme.Codecs.EncoderForVersion(info.StreamSerializer.Serializer, corev1.SchemeGroupVersion).
		Encode(&metav1.WatchEvent{Type: string(typ), Object: k8sruntime.RawExtension{Raw: raw.Bytes()}}, &event)
	if err != nil {
		tb.Fatal(err)
	}
	var out bytes.Buffer
	if _, err := info.StreamSerializer.Framer.NewFrameWriter(&out).Write(event.Bytes()); err != nil {
		tb.Fatal(err)
	}
	return out.Bytes()
}

// configMap returns a ConfigMap whose value is hard on a JSON scanner.
func configMap(i int, value string) *corev1.ConfigMap {
	return &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("cm-%d", i), Namespace: "ns", ResourceVersion: fmt.Sprint(100 + i)},
		Data:       map[string]string{"value": value, "tricky": `}{"]["\\"\u00e9\n` + "\x00\x1f"},
	}
}

// testFrames returns n realistic watch event frames.
func testFrames(tb testing.TB, framing Framing, n int) [][]byte {
	frames := make([][]byte, n)
	for i := range frames {
		frames[i] = encodeEvent(tb, framing, watch.Modified, configMap(i, fmt.Sprintf("v%d {\"%d\"}", i, i)))
	}
	return frames
}

type decodedEvent struct {
	Type   watch.EventType
	Object k8sruntime.Object
}

// decodeAll decodes a whole watch stream with client-go's own watch decoder,
// set up as rest.Request.Watch does for a response of that Content-Type.
// It returns the events decoded and the error that ended decoding (nil at
// a clean io.EOF).
func decodeAll(tb testing.TB, framing Framing, data []byte) ([]decodedEvent, error) {
	tb.Helper()
	return decodeAllWith(tb, scheme.Codecs.WithoutConversion(), framing, data)
}

// decodeAllWith is decodeAll for a client with that NegotiatedSerializer.
func decodeAllWith(tb testing.TB, serializers k8sruntime.NegotiatedSerializer, framing Framing, data []byte) ([]decodedEvent, error) {
	tb.Helper()
	mediaType, params, err := mime.ParseMediaType(contentType(framing))
	if err != nil {
		tb.Fatal(err)
	}
	negotiator := k8sruntime.NewClientNegotiator(serializers, corev1.SchemeGroupVersion)
	objectDecoder, streamSerializer, framer, err := negotiator.StreamDecoder(mediaType, params)
	if err != nil {
		tb.Fatal(err)
	}
	frameReader := framer.NewFrameReader(io.NopCloser(bytes.NewReader(data)))
	decoder := restclientwatch.NewDecoder(streaming.NewDecoder(frameReader, streamSerializer), objectDecoder)
	defer decoder.Close()
	var events []decodedEvent
	for {
		typ, obj, err := decoder.Decode()
		if errors.Is(err, io.EOF) {
			return events, nil
		}
		if err != nil {
			return events, err
		}
		events = append(events, decodedEvent{typ, obj})
	}
}

// recorder is the client side of Copy: it records every Write and flush.
type recorder struct {
	mu      sync.Mutex
	buf     bytes.Buffer
	writes  [][]byte
	flushes int
	// onFlush, if set, is called after each flush with their count so far.
	onFlush func(flushes int)
	// failAfter, if > 0, makes every Write after that many fail.
	failAfter int
}

var errClientGone = errors.New("client gone")

func (r *recorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failAfter > 0 && len(r.writes) >= r.failAfter {
		return 0, errClientGone
	}
	r.writes = append(r.writes, bytes.Clone(p))
	r.buf.Write(p)
	return len(p), nil
}

func (r *recorder) flush() {
	r.mu.Lock()
	r.flushes++
	n, hook := r.flushes, r.onFlush
	r.mu.Unlock()
	if hook != nil {
		hook(n)
	}
}

func (r *recorder) bytes() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	return bytes.Clone(r.buf.Bytes())
}

// chunkReader returns data in reads of sizes taken in turn from sizes (each
// 1 to 256 bytes; 1 byte at a time when sizes is empty).
type chunkReader struct {
	data  []byte
	sizes []byte
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.data) == 0 {
		return 0, io.EOF
	}
	n := 1
	if len(c.sizes) > 0 {
		n = int(c.sizes[c.i%len(c.sizes)]) + 1
		c.i++
	}
	n = min(n, len(p), len(c.data))
	copy(p, c.data[:n])
	c.data = c.data[n:]
	return n, nil
}

// waitNoGoroutines fails the test unless, within 5s, no goroutine is running
// any of this package's code. Tests of this package do not run in parallel.
func waitNoGoroutines(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(5 * time.Second)
	buf := make([]byte, 4<<20)
	for {
		stacks := buf[:runtime.Stack(buf, true)]
		leaked := ""
		for _, fn := range []string{"watchstream.readFrames", "watchstream.WrapResponse.func", "watchstream.Copy("} {
			if bytes.Contains(stacks, []byte(fn)) {
				leaked = fn
			}
		}
		if leaked == "" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("goroutine running %s still alive 5s after Copy returned and the body was closed:\n%s", leaked, stacks)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
