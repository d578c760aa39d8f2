package watchstream

import (
	"context"
	"io"
	"net/http"
)

// WrapResponse prepares the upstream response to a WATCH request for
// httputil.ReverseProxy: called from ModifyResponse, it replaces resp.Body
// with a pipe that Copy fills from the original body in a new goroutine, so
// the client receives whole frames, ending with the 410 Expired ERROR event
// once expire fires. Unlike Copy, it writes the frames that are already
// waiting together, to save a flush per event, and, when check is not nil,
// hands on only the event frames check lets through: at the first it
// refuses, the stream ends with a 503 ERROR event instead (Outcome
// Refused). The goroutine closes the original body when the copy returns,
// then calls done (if not nil) with its result; ReverseProxy closing the
// new body (at its end, or when the client goes away) ends the copy. The
// copy's context is resp.Request's.
//
// It wraps only a 200 response with no Content-Length, no Content-Encoding
// (other than identity) and a Content-Type that FramingFor knows, and
// otherwise leaves resp untouched and returns false. Whether the request was
// a WATCH (watch=true or a /watch/ path) is for the caller to decide.
func WrapResponse(resp *http.Response, expire <-chan string, check Check, done func(Result, error)) bool {
	if resp.StatusCode != http.StatusOK || resp.ContentLength >= 0 || resp.Body == nil {
		return false
	}
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && ce != "identity" {
		return false
	}
	framing, ok := FramingFor(resp.Header.Get("Content-Type"))
	if !ok {
		return false
	}
	ctx := context.Background()
	if resp.Request != nil {
		ctx = resp.Request.Context()
	}
	upstream := resp.Body
	pr, pw := io.Pipe()
	resp.Body = pr
	go func() {
		// ReverseProxy flushes every write of a streamed body, so frames
		// that are already waiting are coalesced into one write.
		res, err := copyStream(ctx, pw, nil, upstream, framing, expire, check, true)
		// An upstream Close error would say nothing new.
		_ = upstream.Close()
		if err != nil {
			// ReverseProxy then aborts the response: the client sees a
			// broken stream, not a clean end.
			pw.CloseWithError(err)
		} else {
			// The client sees EOF after the last whole frame.
			pw.Close()
		}
		if done != nil {
			done(res, err)
		}
	}()
	return true
}
