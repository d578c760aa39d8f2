package watchstream

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/watch"
)

// BenchmarkCopy measures Copy's throughput on ConfigMap events of about
// 10 KiB, mostly text with a few escapes.
func BenchmarkCopy(b *testing.B) {
	for _, framing := range []Framing{JSON, Protobuf} {
		b.Run(framing.String(), func(b *testing.B) {
			var stream []byte
			for i := range 100 {
				stream = append(stream, encodeEvent(b, framing, watch.Modified, configMap(i, strings.Repeat(`The quick brown fox "jumps" over the lazy dog.\n `, 200)))...)
			}
			b.SetBytes(int64(len(stream)))
			b.ReportAllocs()
			for b.Loop() {
				res, err := Copy(context.Background(), io.Discard, nil, bytes.NewReader(stream), framing, nil)
				if err != nil || res.Events != 100 {
					b.Fatal(res, err)
				}
			}
		})
	}
}
