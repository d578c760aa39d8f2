package watchstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
)

// fuzzExpire runs Copy over body and, if expireAfter >= 0, expires the watch
// once expireAfter frames have been flushed (at once if 0).
func fuzzExpire(t *testing.T, framing Framing, body []byte, sizes []byte, expireAfter int) (*recorder, Result, error) {
	t.Helper()
	expire := make(chan string, 1)
	rec := &recorder{}
	rec.onFlush = func(n int) {
		if n == expireAfter {
			expire <- "fuzz"
		}
	}
	if expireAfter == 0 {
		expire <- "fuzz"
	}
	res, err := Copy(context.Background(), rec, rec.flush, &chunkReader{data: body, sizes: sizes}, framing, expire)
	return rec, res, err
}

// splitPayloads cuts data at each 0xff into up to 16 payloads.
func splitPayloads(data []byte) [][]byte {
	parts := bytes.Split(data, []byte{0xff})
	if len(parts) > 16 {
		parts = parts[:16]
	}
	return parts
}

// FuzzCopyJSON: JSON watch events with arbitrary string values (quotes,
// backslashes, braces, invalid UTF-8 turned into escapes), arbitrary
// whitespace between them, arbitrary read sizes, expired at an arbitrary
// event. The client must get the exact input, or a whole-event prefix of it
// and the ERROR event, and client-go must decode it.
func FuzzCopyJSON(f *testing.F) {
	f.Add([]byte("a\xffb\"}{\\\xff\xff["), []byte("\n"), []byte{0, 3, 200}, int8(-1))
	f.Add([]byte("x\xffy\xffz"), []byte(" \t\r\n"), []byte{}, int8(2))
	f.Add([]byte(`\u00e9"\\"`), []byte{}, []byte{255}, int8(0))
	f.Add([]byte("{\xff}\xff]]]"), []byte("\n\n"), []byte{1, 1, 7}, int8(1))
	f.Fuzz(func(t *testing.T, payload, space, sizes []byte, expireAt int8) {
		values := splitPayloads(payload)
		var frames [][]byte
		for i, v := range values {
			cm := configMap(i, string(v))
			cm.TypeMeta = metav1.TypeMeta{Kind: "ConfigMap", APIVersion: "v1"}
			obj, err := json.Marshal(cm)
			if err != nil {
				t.Skip(err)
			}
			event, err := json.Marshal(map[string]any{"type": "ADDED", "object": json.RawMessage(obj)})
			if err != nil {
				t.Fatal(err)
			}
			// Whitespace after the event, from space, "\n" by default.
			ws := []byte("\n")
			if len(space) > 0 {
				ws = nil
				for j := range int(space[i%len(space)]) % 4 {
					ws = append(ws, " \t\r\n"[(int(space[(i+j)%len(space)])/4)%4])
				}
			}
			frames = append(frames, append(event, ws...))
		}
		input := concat(frames)
		expireAfter := int(expireAt)
		if expireAfter >= len(frames) {
			expireAfter = -1
		}

		rec, res, err := fuzzExpire(t, JSON, input, sizes, expireAfter)
		if err != nil {
			t.Fatalf("Copy: %v", err)
		}
		out := rec.bytes()
		checkWholeWrites(t, JSON, rec.writes)
		events, err := decodeAll(t, JSON, out)
		if err != nil {
			t.Fatalf("client-go's decoder: %v\n%q", err, out)
		}
		if expireAfter < 0 {
			if res.Outcome != Drained || res.Events != len(frames) || !bytes.Equal(out, input) {
				t.Fatalf("result %+v; client got\n%q\nwant\n%q", res, out, input)
			}
			if len(events) != len(frames) {
				t.Fatalf("decoded %d events, want %d", len(events), len(frames))
			}
		} else {
			if res.Outcome != Expired || res.Events != expireAfter {
				t.Fatalf("result %+v, want Expired after %d events", res, expireAfter)
			}
			errEvent, err := expiredEvent(JSON, "fuzz")
			if err != nil {
				t.Fatal(err)
			}
			// A prefix of the input, then the ERROR event on a line of its
			// own: Copy adds a "\n" if the input's did not come first.
			head, ok := bytes.CutSuffix(out, errEvent)
			if trimmed, added := bytes.CutSuffix(head, []byte("\n")); ok && !bytes.HasPrefix(input, head) && added &&
				(len(trimmed) == 0 || trimmed[len(trimmed)-1] != '\n') {
				head = trimmed
			}
			if !ok || !bytes.HasPrefix(input, head) {
				t.Fatalf("client got\n%q\nwhich is not a prefix of\n%q\nand the ERROR event", out, input)
			}
			if before := out[:len(out)-len(errEvent)]; len(before) > 0 && before[len(before)-1] != '\n' {
				t.Fatalf("ERROR event not on a line of its own: %q", out)
			}
			if len(events) != expireAfter+1 || events[expireAfter].Type != watch.Error {
				t.Fatalf("decoded %d events, want %d then ERROR", len(events), expireAfter)
			}
			checkExpiredEvent(t, events[expireAfter], "fuzz")
		}
		for i, ev := range events[:res.Events] {
			cm, ok := ev.Object.(*corev1.ConfigMap)
			var want string // the value as JSON carries it: invalid UTF-8 replaced
			if b, err := json.Marshal(string(values[i])); err != nil || json.Unmarshal(b, &want) != nil {
				t.Fatal("round trip of the value through JSON")
			}
			if !ok || cm.Name != fmt.Sprintf("cm-%d", i) || cm.Data["value"] != want {
				t.Fatalf("event %d decoded as %#v", i, ev.Object)
			}
		}
	})
}

// FuzzCopyJSONArbitrary: any bytes at all. Copy must not panic or hang, and
// the client gets a prefix of the input (all of it when Copy succeeds).
func FuzzCopyJSONArbitrary(f *testing.F) {
	f.Add([]byte(`{"a":"}\"{"}`+"\n"+`{"b":[{},[]]}`), []byte{2})
	f.Add([]byte(`{"a":"\\"}{`), []byte{})
	f.Add([]byte(" \n{}}"), []byte{0, 9})
	f.Add([]byte(`{]`), []byte{})
	f.Fuzz(func(t *testing.T, input, sizes []byte) {
		rec, res, err := fuzzExpire(t, JSON, input, sizes, -1)
		out := rec.bytes()
		if !bytes.HasPrefix(input, out) {
			t.Fatalf("client got %q, not a prefix of %q", out, input)
		}
		if err == nil && (res.Outcome != Drained || !bytes.Equal(out, input)) {
			t.Fatalf("Copy succeeded (%+v) but the client got %q of %q", res, out, input)
		}
	})
}

// FuzzCopyProtobuf: length-delimited frames with arbitrary payloads,
// arbitrary read sizes, expired at an arbitrary frame.
func FuzzCopyProtobuf(f *testing.F) {
	f.Add([]byte("k8s\x00\n\x05ADDED\xff\x00\x00\x00\x00\xff"), []byte{0, 3, 200}, int8(-1))
	f.Add([]byte("a\xffb\xffc"), []byte{}, int8(1))
	f.Add([]byte(""), []byte{7}, int8(0))
	f.Fuzz(func(t *testing.T, payload, sizes []byte, expireAt int8) {
		var frames [][]byte
		for _, p := range splitPayloads(payload) {
			frames = append(frames, append(binary.BigEndian.AppendUint32(nil, uint32(len(p))), p...))
		}
		input := concat(frames)
		expireAfter := int(expireAt)
		if expireAfter >= len(frames) {
			expireAfter = -1
		}
		rec, res, err := fuzzExpire(t, Protobuf, input, sizes, expireAfter)
		if err != nil {
			t.Fatalf("Copy: %v", err)
		}
		checkWholeWrites(t, Protobuf, rec.writes)
		out := rec.bytes()
		want := input
		if expireAfter >= 0 {
			errEvent, err := expiredEvent(Protobuf, "fuzz")
			if err != nil {
				t.Fatal(err)
			}
			want = append(concat(frames[:expireAfter]), errEvent...)
			if res.Outcome != Expired || res.Events != expireAfter {
				t.Fatalf("result %+v, want Expired after %d frames", res, expireAfter)
			}
		} else if res.Outcome != Drained || res.Events != len(frames) {
			t.Fatalf("result %+v, want Drained after %d frames", res, len(frames))
		}
		if !bytes.Equal(out, want) {
			t.Fatalf("client got\n%q\nwant\n%q", out, want)
		}
	})
}
