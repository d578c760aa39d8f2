// Package watchstream copies a Kubernetes watch response body from
// kube-apiserver to a client one whole event frame at a time, and can end the
// stream with a "410 Expired" ERROR event written in the stream's own
// encoding.
//
// A client-go reflector that receives such an ERROR event ends its watch and
// relists (LIST, then WATCH from the list's resourceVersion). Merely closing
// the connection is not the same: the reflector would watch again from the
// last resourceVersion it saw, and never learn of objects it should now see
// but was not shown before, such as those of a shard the operator was just
// given.
//
// Use it only on the response to a WATCH request (query watch=true, or a
// legacy /watch/ path) that is plain HTTP, not a websocket upgrade, and only
// when the upstream status is 200 and there is no Content-Encoding;
// kube-apiserver does not compress watch streams. Pass anything else through.
//
// With httputil.ReverseProxy, call WrapResponse from ModifyResponse:
//
//	rp.ModifyResponse = func(resp *http.Response) error {
//		if isWatch(resp.Request) {
//			watchstream.WrapResponse(resp, expireChanFor(resp.Request), nil)
//		}
//		return nil
//	}
//
// In a handler of one's own, call Copy after writing the header:
//
//	framing, ok := watchstream.FramingFor(resp.Header.Get("Content-Type"))
//	if !ok { /* e.g. CBOR: copy the body as it is, flushing */ }
//	copyHeader(w.Header(), resp.Header)
//	w.WriteHeader(resp.StatusCode)
//	res, err := watchstream.Copy(req.Context(), w, flusher.Flush, resp.Body, framing, expire) // res.Outcome: why it ended
//	resp.Body.Close() // right after Copy returns: see Copy
//	if err != nil { panic(http.ErrAbortHandler) } // end the stream abruptly
//
// To expire watches, send a message on their expire channel, or close it to
// expire every watch that was given it at once.
//
// The package keeps no state between calls and does not log.
package watchstream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"strings"
)

// Framing is how the events of a watch stream are framed and encoded.
type Framing int

const (
	// JSON is a stream of JSON watch events, each one JSON object
	// (kube-apiserver ends each with "\n"). Content-Type "application/json".
	JSON Framing = iota + 1
	// Protobuf is a stream of length-delimited frames: a 4-byte big-endian
	// length, then a protobuf-encoded metav1.WatchEvent whose Object.Raw holds
	// the object in the usual Kubernetes protobuf envelope ("k8s\x00" and
	// runtime.Unknown). Content-Type
	// "application/vnd.kubernetes.protobuf;stream=watch".
	Protobuf
)

// String returns "JSON", "Protobuf" or "Framing(n)".
func (f Framing) String() string {
	switch f {
	case JSON:
		return "JSON"
	case Protobuf:
		return "Protobuf"
	default:
		return fmt.Sprintf("Framing(%d)", int(f))
	}
}

// Media types of watch responses, as kube-apiserver sets them.
const (
	// MediaTypeJSON is the Content-Type of a JSON watch response.
	MediaTypeJSON = "application/json"
	// MediaTypeProtobuf is the media type of a protobuf watch response; the
	// Content-Type also has the parameter stream=watch.
	MediaTypeProtobuf = "application/vnd.kubernetes.protobuf"
)

// MaxFrameSize bounds one event frame read from upstream (for protobuf,
// without its 4-byte length prefix). A larger frame makes Copy fail with
// ErrFrameTooLarge. kube-apiserver's own request limit is far below it.
const MaxFrameSize = 64 << 20

var (
	// ErrFrameTooLarge is returned by Copy when an upstream frame is longer
	// than MaxFrameSize.
	ErrFrameTooLarge = errors.New("watchstream: watch event frame larger than the maximum size")
	// ErrMalformed is returned by Copy when the upstream stream is not
	// framed as its Framing says.
	ErrMalformed = errors.New("watchstream: malformed watch stream")
)

// FramingFor returns the framing of a watch response from its Content-Type,
// and false for a media type whose framing this package does not know, such
// as CBOR ("application/cbor-seq"): the caller should then pass the body
// through untouched. It accepts "application/json" (any parameters) and
// "application/vnd.kubernetes.protobuf" with the parameter stream=watch, which
// kube-apiserver sets on protobuf watch responses and not on protobuf
// objects, such as a metav1.Status error body.
func FramingFor(contentType string) (Framing, bool) {
	mediaType, params, err := mime.ParseMediaType(contentType)
	if err != nil {
		return 0, false
	}
	switch mediaType {
	case MediaTypeJSON:
		return JSON, true
	case MediaTypeProtobuf:
		if strings.EqualFold(params["stream"], "watch") {
			return Protobuf, true
		}
	}
	return 0, false
}

// Outcome says what ended a Copy.
type Outcome int

const (
	// Drained: the upstream body ended (io.EOF) between two frames, as when
	// kube-apiserver ends a watch at its timeout. Nothing was added.
	Drained Outcome = iota + 1
	// Expired: a message arrived on expire, and Copy wrote the 410 Expired
	// ERROR event (unless writing it failed: see the error).
	Expired
	// Canceled: ctx was done, typically because the client went away.
	Canceled
	// Refused: the Check of WrapResponse refused a frame, and the copy wrote
	// a 503 ServiceUnavailable ERROR event carrying its error instead of it
	// (unless writing it failed: see the error).
	Refused
	// Failed: reading, framing or writing failed; the error says which. The
	// client received whole frames only, but the stream is broken, so the
	// caller should end the response abruptly rather than cleanly.
	Failed
)

// String returns the outcome's name.
func (o Outcome) String() string {
	switch o {
	case Drained:
		return "Drained"
	case Expired:
		return "Expired"
	case Canceled:
		return "Canceled"
	case Refused:
		return "Refused"
	case Failed:
		return "Failed"
	default:
		return fmt.Sprintf("Outcome(%d)", int(o))
	}
}

// Check inspects one whole upstream event frame before it is handed on: the
// frame as read (for protobuf, with its 4-byte length prefix), in the
// stream's framing. A non-nil error refuses it: the frame is not written,
// and the stream ends with an ERROR event whose 503 Status carries the
// error's text. A Check sees every event frame, in order, from one
// goroutine, and none after the one it refused.
type Check func(framing Framing, frame []byte) error

// Result describes a finished Copy.
type Result struct {
	// Outcome says what ended the copy.
	Outcome Outcome
	// Events is the number of whole watch events copied from upstream,
	// not counting the ERROR event Copy wrote itself.
	Events int
	// Bytes is the number of bytes written to w, the ERROR event included.
	Bytes int64
}

// DefaultExpireMessage is the Status message of the ERROR event when the
// expire channel was closed or delivered "".
const DefaultExpireMessage = "watch expired by the ctrlmesh proxy: relist required"

// Copy copies watch events from body to w, one whole frame at a time, calling
// flush (if not nil) after each, until one of:
//
//   - body ends between two frames: Outcome Drained, nil error;
//   - a message arrives on expire, or expire is closed: once the frame being
//     written (if any) is written completely, Copy writes one ERROR watch
//     event carrying metav1.Status{Status: Failure, Code: 410, Reason:
//     Expired, Message: msg}, in the same framing and encoding as the stream,
//     flushes, and returns Outcome Expired and a nil error. A closed channel
//     or "" uses DefaultExpireMessage, so closing one channel can expire
//     many watches at once. A nil expire never fires;
//   - ctx is done: Outcome Canceled and ctx.Err();
//   - a read, framing or write error: Outcome Failed and that error (a body
//     ending inside a frame gives io.ErrUnexpectedEOF).
//
// Copy never writes part of a frame: bytes are written to w only as whole
// upstream frames (for JSON, with any whitespace around them) and the ERROR
// event. For JSON it writes the upstream bytes unchanged. The caller should
// have written the response header, with upstream's Content-Type, before.
//
// Reading body blocks, so Copy reads it in a goroutine. The contract is that
// the caller closes body as soon as Copy returns (the usual defer
// resp.Body.Close() does): that goroutine may still be inside body.Read,
// which closing the body (or the upstream request's context ending) makes
// return; the goroutine then exits at once, without reading more or touching
// w. Copy does not close body itself. body must not be read by anyone else.
func Copy(ctx context.Context, w io.Writer, flush func(), body io.Reader, framing Framing, expire <-chan string) (Result, error) {
	return copyStream(ctx, w, flush, body, framing, expire, nil, false)
}

// copyStream is Copy, handing on only the event frames check (if not nil)
// lets through; with coalesce, frames already waiting leave together in one
// write (see WrapResponse).
func copyStream(ctx context.Context, w io.Writer, flush func(), body io.Reader, framing Framing, expire <-chan string, check Check, coalesce bool) (Result, error) {
	var res Result
	next, err := newFrameReader(framing, body)
	if err != nil {
		res.Outcome = Failed
		return res, err
	}
	if err := ctx.Err(); err != nil {
		res.Outcome = Canceled
		return res, err
	}

	// When coalescing, the reader runs ahead by a few frames so that a burst
	// of events can leave in one write.
	ahead := 0
	if coalesce {
		ahead = readAhead
	}
	frames := make(chan frame, ahead)
	done := make(chan struct{})
	defer close(done)
	go readFrames(next, frames, done)

	cw := &countingWriter{w: w}
	var batch []byte
	// end writes an ERROR event and ends the copy with outcome.
	end := func(outcome Outcome, event []byte, err error) (Result, error) {
		res.Outcome = outcome
		if err == nil && framing == JSON && cw.n > 0 && cw.last != '\n' {
			// The previous frame's "\n" had not arrived yet: keep the
			// ERROR event on a line of its own for line-oriented clients.
			event = append([]byte{'\n'}, event...)
		}
		if err == nil {
			err = cw.writeAll(event)
		}
		if err == nil && flush != nil {
			flush()
		}
		res.Bytes = cw.n
		return res, err
	}
	expireNow := func(msg string, open bool) (Result, error) {
		if !open || msg == "" {
			msg = DefaultExpireMessage
		}
		event, err := expiredEvent(framing, msg)
		return end(Expired, event, err)
	}
	// refuse writes the batch of frames checked so far, then the ERROR
	// event for the frame check refused.
	refuse := func(batch []byte, events int, refusal error) (Result, error) {
		if err := cw.writeAll(batch); err != nil {
			res.Outcome = Failed
			res.Bytes = cw.n
			return res, err
		}
		res.Events += events
		event, err := refusedEvent(framing, refusal.Error())
		return end(Refused, event, err)
	}
	// refusal is check's verdict on a frame.
	refusal := func(f frame) error {
		if check == nil || !f.event {
			return nil
		}
		return check(framing, f.data)
	}

	canceled := func() (Result, error) {
		res.Outcome = Canceled
		res.Bytes = cw.n
		return res, ctx.Err()
	}
	// ended closes the copy on the reader's error: io.EOF between frames
	// is the stream's clean end.
	ended := func(err error) (Result, error) {
		res.Bytes = cw.n
		if err == io.EOF {
			res.Outcome = Drained
			return res, nil
		}
		res.Outcome = Failed
		return res, err
	}

	for {
		select {
		case <-ctx.Done():
			return canceled()
		case msg, open := <-expire:
			return expireNow(msg, open)
		case f := <-frames:
			if f.err != nil {
				return ended(f.err)
			}
			// A frame and an expiry (or a cancellation) may be ready at
			// once: the expiry wins, so that nothing is copied after it.
			select {
			case <-ctx.Done():
				return canceled()
			case msg, open := <-expire:
				return expireNow(msg, open)
			default:
			}
			if err := refusal(f); err != nil {
				return refuse(nil, 0, err)
			}
			// When coalescing, the frames already waiting go out in one
			// write and one flush, as kube-apiserver flushes only when its
			// queue is empty: a flush per event costs a syscall per event.
			batch = append(batch[:0], f.data...)
			events := 0
			if f.event {
				events++
			}
			var last *frame
		gather:
			for coalesce && len(batch) < maxBatch {
				select {
				case g := <-frames:
					if g.err != nil {
						last = &g
						break gather
					}
					if err := refusal(g); err != nil {
						return refuse(batch, events, err)
					}
					batch = append(batch, g.data...)
					if g.event {
						events++
					}
				default:
					break gather
				}
			}
			if err := cw.writeAll(batch); err != nil {
				res.Outcome = Failed
				res.Bytes = cw.n
				return res, err
			}
			res.Events += events
			if flush != nil {
				flush()
			}
			if last != nil {
				return ended(last.err)
			}
		}
	}
}

const (
	// readAhead is how many frames the reader may hold ready.
	readAhead = 64
	// maxBatch bounds one coalesced write.
	maxBatch = 1 << 20
)

// frame is one whole upstream frame, or the error that ended reading.
type frame struct {
	data []byte
	// event is false for JSON whitespace that trailed the last event.
	event bool
	err   error
}

// frameReader returns the next whole frame of a stream; io.EOF only at a
// frame boundary. The returned slice is owned by the caller.
type frameReader interface {
	next() (data []byte, event bool, err error)
}

func newFrameReader(framing Framing, body io.Reader) (frameReader, error) {
	switch framing {
	case JSON:
		return &jsonFrameReader{r: body}, nil
	case Protobuf:
		return &protobufFrameReader{r: body}, nil
	default:
		return nil, fmt.Errorf("watchstream: unknown framing %v", framing)
	}
}

// readFrames sends frames until a read error (sent too) or done is closed.
// It never blocks on anything but body.Read and the hand-over to Copy.
func readFrames(r frameReader, out chan<- frame, done <-chan struct{}) {
	for {
		data, event, err := r.next()
		select {
		case out <- frame{data: data, event: event, err: err}:
		case <-done:
			return
		}
		if err != nil {
			return
		}
		select {
		case <-done:
			return
		default:
		}
	}
}

// countingWriter counts bytes written and remembers the last one.
type countingWriter struct {
	w    io.Writer
	n    int64
	last byte
}

func (c *countingWriter) writeAll(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	n, err := c.w.Write(p)
	c.n += int64(n)
	if n > 0 {
		c.last = p[n-1]
	}
	if err == nil && n < len(p) {
		err = io.ErrShortWrite
	}
	return err
}
