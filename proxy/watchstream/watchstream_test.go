package watchstream

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"testing/iotest"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/framer"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
)

func TestFramingFor(t *testing.T) {
	for _, tc := range []struct {
		contentType string
		want        Framing
		ok          bool
	}{
		{"application/json", JSON, true},
		{"application/json; charset=utf-8", JSON, true},
		{"Application/JSON", JSON, true},
		{"application/json;stream=watch", JSON, true},
		{"application/vnd.kubernetes.protobuf;stream=watch", Protobuf, true},
		{"application/vnd.kubernetes.protobuf; stream=Watch", Protobuf, true},
		// A protobuf object, such as a Status error body, is not a stream.
		{"application/vnd.kubernetes.protobuf", 0, false},
		{"application/cbor-seq", 0, false},
		{"application/cbor", 0, false},
		{"application/yaml", 0, false},
		{"text/plain; charset=utf-8", 0, false},
		{"", 0, false},
		{"application/json;;", 0, false},
	} {
		got, ok := FramingFor(tc.contentType)
		if got != tc.want || ok != tc.ok {
			t.Errorf("FramingFor(%q) = %v, %v; want %v, %v", tc.contentType, got, ok, tc.want, tc.ok)
		}
	}
}

// TestExpiredEventDecodes checks the ERROR event against client-go's own
// watch decoder, as a typed client and as a dynamic (unstructured) one, and
// against apierrors as the reflector uses it.
func TestExpiredEventDecodes(t *testing.T) {
	for _, framing := range []Framing{JSON, Protobuf} {
		t.Run(framing.String(), func(t *testing.T) {
			event, err := expiredEvent(framing, "shard 3 moved")
			if err != nil {
				t.Fatal(err)
			}
			events, err := decodeAll(t, framing, event)
			if err != nil {
				t.Fatal(err)
			}
			if len(events) != 1 {
				t.Fatalf("decoded %d events, want 1", len(events))
			}
			checkExpiredEvent(t, events[0], "shard 3 moved")
			if framing == JSON {
				// The dynamic client, as informers of unstructured objects
				// use it.
				events, err := decodeAllWith(t, dynamic.ConfigFor(&rest.Config{}).NegotiatedSerializer, framing, event)
				if err != nil {
					t.Fatal(err)
				}
				if len(events) != 1 {
					t.Fatalf("decoded %d events, want 1", len(events))
				}
				checkExpiredEvent(t, events[0], "shard 3 moved")
			}
		})
	}
}

func checkExpiredEvent(t *testing.T, ev decodedEvent, msg string) {
	t.Helper()
	if ev.Type != watch.Error {
		t.Fatalf("event type %q, want ERROR", ev.Type)
	}
	err := apierrors.FromObject(ev.Object)
	if !apierrors.IsResourceExpired(err) {
		t.Errorf("apierrors.FromObject(%#v) = %v: not IsResourceExpired", ev.Object, err)
	}
	var status apierrors.APIStatus
	if !errors.As(err, &status) {
		t.Fatalf("%v is not an APIStatus", err)
	}
	s := status.Status()
	if s.Code != http.StatusGone || s.Reason != metav1.StatusReasonExpired || s.Status != metav1.StatusFailure || s.Message != msg {
		t.Errorf("status %+v, want Failure, 410, Expired, %q", s, msg)
	}
}

// blockingBody returns data, then blocks until closed, like an upstream
// watch body with no event to send.
func blockingBody(data []byte) (io.Reader, func()) {
	pr, pw := io.Pipe()
	go func() {
		_, _ = pw.Write(data)
	}()
	return pr, func() { _ = pr.Close() }
}

func concat(frames [][]byte) []byte {
	return bytes.Join(frames, nil)
}

func TestCopy(t *testing.T) {
	const nFrames = 5
	const msg = "shard moved"
	type bodyFunc func(frames [][]byte) (io.Reader, func())
	whole := func(frames [][]byte) (io.Reader, func()) { return bytes.NewReader(concat(frames)), func() {} }
	oneByte := func(frames [][]byte) (io.Reader, func()) {
		return iotest.OneByteReader(bytes.NewReader(concat(frames))), func() {}
	}
	chunks := func(frames [][]byte) (io.Reader, func()) {
		return &chunkReader{data: concat(frames), sizes: []byte{6, 200, 0, 33, 2, 90}}, func() {}
	}
	blocking := func(frames [][]byte) (io.Reader, func()) { return blockingBody(concat(frames)) }
	// blockingHalf sends 3 frames and half of the 4th, then blocks.
	blockingHalf := func(frames [][]byte) (io.Reader, func()) {
		return blockingBody(append(concat(frames[:3]), frames[3][:len(frames[3])/2]...))
	}
	// blockingOneByte sends all frames a byte at a time, then blocks.
	blockingOneByte := func(frames [][]byte) (io.Reader, func()) {
		r, closeBody := blockingBody(concat(frames))
		return iotest.OneByteReader(r), closeBody
	}
	truncated := func(frames [][]byte) (io.Reader, func()) {
		return bytes.NewReader(append(concat(frames[:2]), frames[2][:len(frames[2])-3]...)), func() {}
	}

	for _, tc := range []struct {
		name string
		body bodyFunc
		// expireAfter / cancelAfter: after that many flushes (0: before
		// Copy starts); -1: never.
		expireAfter, cancelAfter int
		closeExpire              bool
		failWritesAfter          int
		wantOutcome              Outcome
		wantErr                  error
		wantEvents               int
		wantExpired              bool
	}{
		{name: "frames then EOF", body: whole, expireAfter: -1, cancelAfter: -1, wantOutcome: Drained, wantEvents: nFrames},
		{name: "one byte at a time then EOF", body: oneByte, expireAfter: -1, cancelAfter: -1, wantOutcome: Drained, wantEvents: nFrames},
		{name: "odd chunks then EOF", body: chunks, expireAfter: -1, cancelAfter: -1, wantOutcome: Drained, wantEvents: nFrames},
		{name: "expire mid-stream", body: whole, expireAfter: 2, cancelAfter: -1, wantOutcome: Expired, wantEvents: 2, wantExpired: true},
		{name: "expire before any frame", body: whole, expireAfter: 0, cancelAfter: -1, wantOutcome: Expired, wantEvents: 0, wantExpired: true},
		{name: "expire while waiting for events", body: blocking, expireAfter: nFrames, cancelAfter: -1, wantOutcome: Expired, wantEvents: nFrames, wantExpired: true},
		{name: "expire with half a frame received", body: blockingHalf, expireAfter: 3, cancelAfter: -1, wantOutcome: Expired, wantEvents: 3, wantExpired: true},
		{name: "expire after one-byte reads", body: blockingOneByte, expireAfter: nFrames, cancelAfter: -1, wantOutcome: Expired, wantEvents: nFrames, wantExpired: true},
		{name: "expire channel closed", body: blocking, expireAfter: 1, closeExpire: true, cancelAfter: -1, wantOutcome: Expired, wantEvents: 1, wantExpired: true},
		{name: "cancel while waiting for events", body: blocking, expireAfter: -1, cancelAfter: nFrames, wantOutcome: Canceled, wantErr: context.Canceled, wantEvents: nFrames},
		{name: "cancel with half a frame received", body: blockingHalf, expireAfter: -1, cancelAfter: 3, wantOutcome: Canceled, wantErr: context.Canceled, wantEvents: 3},
		{name: "canceled before start", body: blocking, expireAfter: -1, cancelAfter: 0, wantOutcome: Canceled, wantErr: context.Canceled, wantEvents: 0},
		{name: "body ends inside a frame", body: truncated, expireAfter: -1, cancelAfter: -1, wantOutcome: Failed, wantErr: io.ErrUnexpectedEOF, wantEvents: 2},
		{name: "client write fails", body: blocking, expireAfter: -1, cancelAfter: -1, failWritesAfter: 2, wantOutcome: Failed, wantErr: errClientGone, wantEvents: 2},
	} {
		for _, framing := range []Framing{JSON, Protobuf} {
			t.Run(tc.name+"/"+framing.String(), func(t *testing.T) {
				frames := testFrames(t, framing, nFrames)
				body, closeBody := tc.body(frames)
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				expire := make(chan string, 1)
				triggerExpire := func() {
					if tc.closeExpire {
						close(expire)
					} else {
						expire <- msg
					}
				}
				rec := &recorder{failAfter: tc.failWritesAfter}
				var canceledAt time.Time
				rec.onFlush = func(n int) {
					if n == tc.expireAfter {
						triggerExpire()
					}
					if n == tc.cancelAfter {
						canceledAt = time.Now()
						cancel()
					}
				}
				if tc.expireAfter == 0 {
					triggerExpire()
				}
				if tc.cancelAfter == 0 {
					canceledAt = time.Now()
					cancel()
				}

				res, err := Copy(ctx, rec, rec.flush, body, framing, expire)
				returned := time.Now()
				closeBody()
				waitNoGoroutines(t)

				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
					t.Errorf("err = %v, want %v", err, tc.wantErr)
				}
				if res.Outcome != tc.wantOutcome || res.Events != tc.wantEvents {
					t.Errorf("result %+v, want outcome %v and %d events", res, tc.wantOutcome, tc.wantEvents)
				}
				if !canceledAt.IsZero() && returned.Sub(canceledAt) > time.Second {
					t.Errorf("Copy returned %s after ctx was canceled", returned.Sub(canceledAt))
				}
				out := rec.bytes()
				if res.Bytes != int64(len(out)) {
					t.Errorf("result counts %d bytes, the client got %d", res.Bytes, len(out))
				}

				// The exact bytes: the first events as upstream sent them,
				// then the ERROR event.
				want := concat(frames[:tc.wantEvents])
				if tc.wantExpired {
					event, err := expiredEvent(framing, msg)
					if tc.closeExpire {
						event, err = expiredEvent(framing, DefaultExpireMessage)
					}
					if err != nil {
						t.Fatal(err)
					}
					want = append(want, event...)
				}
				if !bytes.Equal(out, want) {
					t.Errorf("client got\n%q\nwant\n%q", out, want)
				}

				// Every write is whole frames, each flushed.
				checkWholeWrites(t, framing, rec.writes)
				if rec.flushes != len(rec.writes) {
					t.Errorf("%d writes but %d flushes", len(rec.writes), rec.flushes)
				}

				// What client-go makes of it.
				events, err := decodeAll(t, framing, out)
				if err != nil {
					t.Fatalf("client-go's watch decoder: %v", err)
				}
				wantDecoded := tc.wantEvents
				if tc.wantExpired {
					wantDecoded++
				}
				if len(events) != wantDecoded {
					t.Fatalf("client-go decoded %d events, want %d", len(events), wantDecoded)
				}
				for i, ev := range events[:tc.wantEvents] {
					cm, ok := ev.Object.(*corev1.ConfigMap)
					if ev.Type != watch.Modified || !ok || cm.Name != configMap(i, "").Name {
						t.Errorf("event %d: %s %#v, want MODIFIED of ConfigMap %s", i, ev.Type, ev.Object, configMap(i, "").Name)
					}
				}
				if tc.wantExpired {
					wantMsg := msg
					if tc.closeExpire {
						wantMsg = DefaultExpireMessage
					}
					checkExpiredEvent(t, events[len(events)-1], wantMsg)
				}
			})
		}
	}
}

// checkWholeWrites fails unless each write is a sequence of whole watch
// events: for protobuf length-delimited frames that end exactly at the end of
// the write, for JSON JSON objects with only whitespace around them.
func checkWholeWrites(t *testing.T, framing Framing, writes [][]byte) {
	t.Helper()
	for i, w := range writes {
		switch framing {
		case Protobuf:
			for rest := w; len(rest) > 0; {
				if len(rest) < 4 || int(binary.BigEndian.Uint32(rest))+4 > len(rest) {
					t.Errorf("write %d does not end on a frame boundary: %q", i, w)
					break
				}
				rest = rest[int(binary.BigEndian.Uint32(rest))+4:]
			}
		case JSON:
			if len(bytes.TrimSpace(w)) == 0 {
				if i != len(writes)-1 {
					t.Errorf("write %d is only whitespace", i)
				}
				continue // whitespace that trailed the last event
			}
			dec := json.NewDecoder(bytes.NewReader(w))
			for {
				var ev metav1.WatchEvent
				err := dec.Decode(&ev)
				if err == io.EOF {
					break
				}
				if err != nil || ev.Type == "" {
					t.Errorf("write %d is not whole JSON watch events: %q (%v)", i, w, err)
					break
				}
			}
		}
	}
}

// TestCopyJSONKeepsErrorOnItsOwnLine: when the "\n" after the last event has
// not arrived, the ERROR event still starts a line of its own.
func TestCopyJSONKeepsErrorOnItsOwnLine(t *testing.T) {
	frame := testFrames(t, JSON, 1)[0]
	object := bytes.TrimRight(frame, "\n")
	body, closeBody := blockingBody(object)
	defer closeBody()
	expire := make(chan string, 1)
	rec := &recorder{onFlush: func(int) { expire <- "moved" }}
	res, err := Copy(context.Background(), rec, rec.flush, body, JSON, expire)
	if err != nil || res.Outcome != Expired {
		t.Fatalf("Copy = %+v, %v", res, err)
	}
	event, err := expiredEvent(JSON, "moved")
	if err != nil {
		t.Fatal(err)
	}
	want := append(append(bytes.Clone(object), '\n'), event...)
	if got := rec.bytes(); !bytes.Equal(got, want) {
		t.Errorf("client got\n%q\nwant\n%q", got, want)
	}
	lines := strings.Split(strings.TrimSuffix(string(rec.bytes()), "\n"), "\n")
	if len(lines) != 2 {
		t.Errorf("want 2 lines, got %d: %q", len(lines), lines)
	}
}

// endlessReader returns prefix, then fill forever.
type endlessReader struct {
	prefix []byte
	fill   byte
}

func (r *endlessReader) Read(p []byte) (int, error) {
	n := copy(p, r.prefix)
	r.prefix = r.prefix[n:]
	for i := n; i < len(p); i++ {
		p[i] = r.fill
	}
	return len(p), nil
}

func TestCopyBrokenStreams(t *testing.T) {
	good := testFrames(t, JSON, 1)[0]
	goodPB := testFrames(t, Protobuf, 1)[0]
	tooLong := binary.BigEndian.AppendUint32(nil, MaxFrameSize+1)
	for _, tc := range []struct {
		name    string
		framing Framing
		body    io.Reader
		wantErr error
		wantOut []byte
	}{
		{"JSON array", JSON, strings.NewReader(`[{"type":"ADDED"}]`), ErrMalformed, nil},
		{"JSON text after an event", JSON, io.MultiReader(bytes.NewReader(good), strings.NewReader("null\n")), ErrMalformed, good},
		{"JSON object closed by a bracket", JSON, strings.NewReader(`{"a":[1}]`), ErrMalformed, nil},
		{"JSON event too large", JSON, &endlessReader{prefix: []byte(`{"type":"ADDED","object":"`), fill: 'x'}, ErrFrameTooLarge, nil},
		{"JSON event unterminated", JSON, strings.NewReader(`{"type":"ADDED","object":{"a":"}"`), io.ErrUnexpectedEOF, nil},
		{"protobuf length too large", Protobuf, io.MultiReader(bytes.NewReader(goodPB), bytes.NewReader(tooLong)), ErrFrameTooLarge, goodPB},
		{"protobuf half a length", Protobuf, io.MultiReader(bytes.NewReader(goodPB), bytes.NewReader([]byte{0, 0})), io.ErrUnexpectedEOF, goodPB},
		{"protobuf body read error", Protobuf, io.MultiReader(bytes.NewReader(goodPB), iotest.ErrReader(io.ErrClosedPipe)), io.ErrClosedPipe, goodPB},
		{"JSON body read error", JSON, io.MultiReader(bytes.NewReader(good), iotest.ErrReader(io.ErrClosedPipe)), io.ErrClosedPipe, good},
		{"unknown framing", Framing(7), strings.NewReader("{}"), nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := &recorder{}
			res, err := Copy(context.Background(), rec, rec.flush, tc.body, tc.framing, nil)
			waitNoGoroutines(t)
			if err == nil || (tc.wantErr != nil && !errors.Is(err, tc.wantErr)) {
				t.Errorf("err = %v, want %v", err, tc.wantErr)
			}
			if res.Outcome != Failed {
				t.Errorf("outcome %v, want Failed", res.Outcome)
			}
			if got := rec.bytes(); !bytes.Equal(got, tc.wantOut) {
				t.Errorf("client got %q, want %q", got, tc.wantOut)
			}
		})
	}
}

// TestCopyJSONPassesWhitespaceThrough: output is the exact input, odd
// whitespace between and after events included.
func TestCopyJSONPassesWhitespaceThrough(t *testing.T) {
	frames := testFrames(t, JSON, 3)
	in := []byte("\r\n  " + string(bytes.TrimRight(frames[0], "\n")) + " \t\n\n" + string(frames[1]) + string(frames[2]) + "\n \n")
	for _, body := range []io.Reader{bytes.NewReader(in), iotest.OneByteReader(bytes.NewReader(in)), iotest.HalfReader(bytes.NewReader(in))} {
		rec := &recorder{}
		res, err := Copy(context.Background(), rec, rec.flush, body, JSON, nil)
		if err != nil || res.Outcome != Drained || res.Events != 3 {
			t.Fatalf("Copy = %+v, %v", res, err)
		}
		if got := rec.bytes(); !bytes.Equal(got, in) {
			t.Errorf("client got\n%q\nwant\n%q", got, in)
		}
	}
	waitNoGoroutines(t)
}

// TestWrapResponse runs the ReverseProxy adapter on a response with a pipe
// for its body: the reader of the new body sees whole frames, then the ERROR
// event, then EOF; the upstream body is closed and done is called.
func TestWrapResponse(t *testing.T) {
	for _, framing := range []Framing{JSON, Protobuf} {
		t.Run(framing.String(), func(t *testing.T) {
			frames := testFrames(t, framing, 3)
			pr, pw := io.Pipe()
			req, err := http.NewRequest(http.MethodGet, "http://upstream/api/v1/configmaps?watch=true", nil)
			if err != nil {
				t.Fatal(err)
			}
			resp := &http.Response{
				StatusCode: http.StatusOK, ContentLength: -1, Body: pr, Request: req,
				Header: http.Header{"Content-Type": {contentType(framing)}},
			}
			expire := make(chan string)
			type result struct {
				res Result
				err error
			}
			done := make(chan result, 1)
			if !WrapResponse(resp, expire, nil, func(res Result, err error) { done <- result{res, err} }) {
				t.Fatal("WrapResponse did not wrap a watch response")
			}
			go func() {
				for _, f := range frames {
					if _, err := pw.Write(f); err != nil {
						return
					}
				}
			}()
			// Read the frames as a client would, then expire.
			want := concat(frames)
			got := make([]byte, len(want))
			if _, err := io.ReadFull(resp.Body, got); err != nil {
				t.Fatal(err)
			}
			expire <- "moved"
			rest, err := io.ReadAll(resp.Body)
			if err != nil {
				t.Fatal(err)
			}
			event, err := expiredEvent(framing, "moved")
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) || !bytes.Equal(rest, event) {
				t.Errorf("client got %q then %q", got, rest)
			}
			r := <-done
			if r.err != nil || r.res.Outcome != Expired || r.res.Events != 3 {
				t.Errorf("done(%+v, %v)", r.res, r.err)
			}
			// The upstream body was closed.
			if _, err := pw.Write([]byte("x")); !errors.Is(err, io.ErrClosedPipe) {
				t.Errorf("upstream body still open: write = %v", err)
			}
			_ = resp.Body.Close()
			waitNoGoroutines(t)
		})
	}

	t.Run("client goes away", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		resp := &http.Response{StatusCode: http.StatusOK, ContentLength: -1, Body: pr, Header: http.Header{"Content-Type": {"application/json"}}}
		done := make(chan error, 1)
		if !WrapResponse(resp, nil, nil, func(_ Result, err error) { done <- err }) {
			t.Fatal("not wrapped")
		}
		frame := testFrames(t, JSON, 1)[0]
		go func() { _, _ = pw.Write(frame) }()
		_ = resp.Body.Close() // as ReverseProxy does when the client is gone
		select {
		case err := <-done:
			if !errors.Is(err, io.ErrClosedPipe) {
				t.Errorf("Copy ended with %v, want io.ErrClosedPipe", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Copy did not end after the client went away")
		}
		waitNoGoroutines(t)
	})

	for _, tc := range []struct {
		name   string
		mutate func(*http.Response)
	}{
		{"not 200", func(r *http.Response) { r.StatusCode = http.StatusGone }},
		{"gzip", func(r *http.Response) { r.Header.Set("Content-Encoding", "gzip") }},
		{"content length", func(r *http.Response) { r.ContentLength = 10 }},
		{"CBOR", func(r *http.Response) { r.Header.Set("Content-Type", "application/cbor-seq") }},
		{"protobuf object", func(r *http.Response) { r.Header.Set("Content-Type", "application/vnd.kubernetes.protobuf") }},
	} {
		t.Run("untouched: "+tc.name, func(t *testing.T) {
			body := io.NopCloser(strings.NewReader("{}"))
			resp := &http.Response{StatusCode: http.StatusOK, ContentLength: -1, Body: body, Header: http.Header{"Content-Type": {"application/json"}}}
			tc.mutate(resp)
			if WrapResponse(resp, nil, nil, nil) || resp.Body != body {
				t.Error("wrapped a response it should have left alone")
			}
		})
	}
}

// TestFramesMatchClientGoFramers: what the frame readers cut matches what
// apimachinery's framers (the ones client-go reads watch streams with) read.
func TestFramesMatchClientGoFramers(t *testing.T) {
	for _, framing := range []Framing{JSON, Protobuf} {
		frames := testFrames(t, framing, 4)
		var fr io.ReadCloser
		body := io.NopCloser(bytes.NewReader(concat(frames)))
		if framing == JSON {
			fr = framer.NewJSONFramedReader(body)
		} else {
			fr = framer.NewLengthDelimitedFrameReader(body)
		}
		ours, err := newFrameReader(framing, bytes.NewReader(concat(frames)))
		if err != nil {
			t.Fatal(err)
		}
		for i := range frames {
			buf := make([]byte, 1<<20)
			n, err := fr.Read(buf)
			if err != nil {
				t.Fatal(err)
			}
			got, _, err := ours.next()
			if err != nil {
				t.Fatal(err)
			}
			// JSON: client-go's framer drops the "\n"; protobuf: the length.
			var payload []byte
			if framing == JSON {
				payload = bytes.TrimSpace(got)
			} else {
				payload = got[4:]
			}
			if !bytes.Equal(payload, buf[:n]) {
				t.Errorf("%v frame %d: ours %q, apimachinery's %q", framing, i, payload, buf[:n])
			}
		}
		if _, _, err := ours.next(); err != io.EOF {
			t.Errorf("%v: after the last frame: %v, want io.EOF", framing, err)
		}
	}
}

// TestCoalescedCopy: with coalescing, a burst leaves in fewer writes, every
// write is whole frames, and the bytes are the input's.
func TestCoalescedCopy(t *testing.T) {
	for _, framing := range []Framing{JSON, Protobuf} {
		t.Run(framing.String(), func(t *testing.T) {
			frames := testFrames(t, framing, 200)
			rec := &recorder{}
			res, err := copyStream(context.Background(), rec, rec.flush, bytes.NewReader(concat(frames)), framing, nil, nil, true)
			if err != nil || res.Outcome != Drained || res.Events != len(frames) {
				t.Fatalf("copyStream = %+v, %v", res, err)
			}
			if !bytes.Equal(rec.bytes(), concat(frames)) {
				t.Fatal("coalesced output differs from the input")
			}
			checkWholeWrites(t, framing, rec.writes)
			if len(rec.writes) >= len(frames) || rec.flushes != len(rec.writes) {
				t.Errorf("%d frames in %d writes with %d flushes: nothing coalesced", len(frames), len(rec.writes), rec.flushes)
			}
			t.Logf("%d frames in %d writes", len(frames), len(rec.writes))
		})
	}
}

// TestCheckRefusesFrames: the frames a Check lets through are handed on
// whole and in order; at the first it refuses, the stream ends with a 503
// ERROR event carrying its error, that frame and those after it never
// written — whether the frames arrive one at a time or together (coalesced
// into one write).
func TestCheckRefusesFrames(t *testing.T) {
	for _, framing := range []Framing{JSON, Protobuf} {
		for _, sizes := range [][]byte{nil, {255}} {
			t.Run(fmt.Sprintf("%s in reads of %v", framing, sizes), func(t *testing.T) {
				frames := testFrames(t, framing, 5)
				var checked [][]byte
				check := func(f Framing, frame []byte) error {
					if f != framing {
						t.Errorf("check called with framing %v, want %v", f, framing)
					}
					checked = append(checked, bytes.Clone(frame))
					if len(checked) == 3 {
						return errors.New("object of another shard")
					}
					return nil
				}
				rec := &recorder{}
				res, err := copyStream(context.Background(), rec, rec.flush, &chunkReader{data: concat(frames), sizes: sizes}, framing, nil, check, true)
				if err != nil || res.Outcome != Refused || res.Events != 2 {
					t.Fatalf("copy ended with %+v, %v; want Refused after 2 events", res, err)
				}
				// JSON frames carry the whitespace read with them, before or after.
				if len(checked) != 3 || !bytes.Equal(bytes.TrimSpace(checked[2]), bytes.TrimSpace(frames[2])) {
					t.Fatalf("check saw %d frames, want the first 3 whole", len(checked))
				}
				event, err := refusedEvent(framing, "object of another shard")
				if err != nil {
					t.Fatal(err)
				}
				if want := append(concat(frames[:2]), event...); !bytes.Equal(rec.bytes(), want) {
					t.Fatalf("client got %q, want the first two frames and the ERROR event", rec.bytes())
				}
				events, err := decodeAll(t, framing, rec.bytes())
				if err != nil || len(events) != 3 || events[2].Type != watch.Error {
					t.Fatalf("client decodes %v, %v", events, err)
				}
				if status, ok := events[2].Object.(*metav1.Status); !ok || status.Code != http.StatusServiceUnavailable || status.Message != "object of another shard" {
					t.Fatalf("ERROR event carries %v", events[2].Object)
				}
				waitNoGoroutines(t)
			})
		}
	}
}
