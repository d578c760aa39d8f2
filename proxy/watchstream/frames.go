package watchstream

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"slices"
)

// readBufferSize is the size of one read from a JSON body.
const readBufferSize = 32 << 10

// jsonFrameReader splits a stream of JSON objects into frames without
// decoding them, by tracking nesting depth outside strings. A frame is
// any whitespace before an object, the object, and the whitespace after it
// that had already been read with it (normally kube-apiserver's "\n"), so the
// frames put together are exactly the stream. It checks only what it needs
// to find object boundaries; anything else that is not valid JSON is left to
// the client's decoder, as if there were no proxy.
type jsonFrameReader struct {
	r io.Reader

	buf    []byte // read buffer, reused
	window []byte // unconsumed part of buf
	err    error  // sticky error of the last read, seen once window is empty

	cur      []byte // current frame, up to the window
	started  bool   // the current frame's object has begun
	depth    int    // nesting of {} and [] outside strings
	inString bool
	escaped  bool // the previous byte in a string was a backslash
}

func isJSONSpace(c byte) bool {
	return c == ' ' || c == '\n' || c == '\r' || c == '\t'
}

func (r *jsonFrameReader) next() ([]byte, bool, error) {
	if r.buf == nil {
		r.buf = make([]byte, readBufferSize)
	}
	for {
		if end, ok, err := r.scan(); err != nil {
			return nil, false, err
		} else if ok {
			// Take the whitespace that came with the object.
			for end < len(r.window) && isJSONSpace(r.window[end]) {
				end++
			}
			if len(r.cur)+end > MaxFrameSize {
				return nil, false, ErrFrameTooLarge
			}
			frame := append(r.cur, r.window[:end]...)
			r.window = r.window[end:]
			r.cur, r.started = nil, false
			return frame, true, nil
		}
		// The window holds no end of object: keep it and read on.
		if len(r.cur)+len(r.window) > MaxFrameSize {
			return nil, false, ErrFrameTooLarge
		}
		r.cur = append(r.cur, r.window...)
		r.window = nil
		if r.err != nil {
			switch {
			case r.err != io.EOF:
				return nil, false, r.err
			case r.started:
				return nil, false, io.ErrUnexpectedEOF
			case len(r.cur) > 0:
				// Whitespace after the last object: pass it on too.
				frame := r.cur
				r.cur = nil
				return frame, false, nil
			default:
				return nil, false, io.EOF
			}
		}
		n, err := r.r.Read(r.buf)
		if n < 0 || n > len(r.buf) {
			return nil, false, fmt.Errorf("watchstream: body Read returned %d bytes for a buffer of %d", n, len(r.buf))
		}
		r.window, r.err = r.buf[:n], err
	}
}

// scan looks through the window for the end of the current object. It returns
// the window offset just past the object's closing brace and true, or false
// once the window is scanned to its end without finding it.
func (r *jsonFrameReader) scan() (int, bool, error) {
	w := r.window
	// nextQuote caches the index of the first '"' in w at or after the last
	// place it was looked for, len(w) if none: strings are skipped with
	// bytes.IndexByte, and each byte is looked at a bounded number of times.
	nextQuote := -1
	for i := 0; i < len(w); i++ {
		c := w[i]
		switch {
		case !r.started:
			if isJSONSpace(c) {
				continue
			}
			if c != '{' {
				return 0, false, fmt.Errorf("%w: JSON watch event does not start with '{' but %q", ErrMalformed, c)
			}
			r.started, r.depth, r.inString, r.escaped = true, 1, false, false
		case r.inString:
			if r.escaped {
				r.escaped = false
				continue
			}
			if nextQuote < i {
				nextQuote = len(w)
				if q := bytes.IndexByte(w[i:], '"'); q >= 0 {
					nextQuote = i + q
				}
			}
			if b := bytes.IndexByte(w[i:nextQuote], '\\'); b >= 0 {
				i += b
				r.escaped = true
				continue
			}
			i = nextQuote // the closing quote, or the end of the window
			if i < len(w) {
				r.inString = false
			}
		default:
			switch c {
			case '"':
				r.inString = true
			case '{', '[':
				r.depth++
			case '}', ']':
				r.depth--
				if r.depth == 0 {
					if c != '}' {
						return 0, false, fmt.Errorf("%w: JSON watch event closed with ']'", ErrMalformed)
					}
					return i + 1, true, nil
				}
			}
		}
	}
	return 0, false, nil
}

// protobufFrameReader reads length-delimited frames: a 4-byte big-endian
// length and that many bytes. Frames are returned with their length prefix.
type protobufFrameReader struct {
	r io.Reader
}

// protobufFirstAlloc bounds what a frame's length prefix alone can make the
// reader allocate; the rest grows as bytes arrive.
const protobufFirstAlloc = 1 << 20

func (r *protobufFrameReader) next() ([]byte, bool, error) {
	var header [4]byte
	if _, err := io.ReadFull(r.r, header[:]); err != nil {
		// io.EOF if nothing was read, io.ErrUnexpectedEOF if part of it.
		return nil, false, err
	}
	size := binary.BigEndian.Uint32(header[:])
	if size > MaxFrameSize {
		return nil, false, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, size)
	}
	total := 4 + int(size)
	frame := make([]byte, 4, 4+min(int(size), protobufFirstAlloc))
	copy(frame, header[:])
	for len(frame) < total {
		if len(frame) == cap(frame) {
			frame = slices.Grow(frame, min(total-len(frame), len(frame)))
		}
		n, err := r.r.Read(frame[len(frame):min(cap(frame), total)])
		frame = frame[:len(frame)+n]
		if err != nil && len(frame) < total {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return nil, false, err
		}
	}
	return frame, true, nil
}
