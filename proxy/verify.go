package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strings"
	"sync"

	"google.golang.org/protobuf/encoding/protowire"
	kjson "sigs.k8s.io/json"

	"github.com/ctrlmesh/ctrlmesh/pkg/sharding"
	"github.com/ctrlmesh/ctrlmesh/proxy/watchstream"
)

// In range mode the proxy asks kube-apiserver to filter lists and watches
// with a shardSelector. Only a server with the ShardedListAndWatch feature
// gate applies it; any other ignores the parameter and answers with every
// shard's objects — an HA control plane mid-upgrade or rolled back, or
// --selector-mode range set by hand. Mode detection, once per proxy, cannot
// see that: behind one Service each request may reach another
// kube-apiserver. So the proxy checks every range-mode response, and hands
// on only what is proven to hold no object outside the selector it sent:
//
//   - A list whose metadata.shardInfo echoes a selector within the one
//     sent: the server applied it. Typed lists carry their metadata before
//     their items, in JSON and in protobuf, so this is decided after the
//     first bytes, and the rest streams through unread.
//   - Otherwise, object by object: each item of a list, and the object of
//     each watch event, must be in a namespace the selector covers. This
//     serves what carries no shardInfo even from a server with the gate —
//     watches (kube-apiserver marks no watch event as sharded) and
//     metadata-only lists (its PartialObjectMetadataList conversion drops
//     shardInfo) — and custom resource lists, whose JSON has its metadata
//     after the items (unstructured lists are written with sorted keys).
//     Items are handed on as they are checked, so memory stays one item.
//
// What cannot be checked either way — a Table, whose rows are not items —
// is refused. The list check does not cover the watch that follows it: a
// reflector's list and watch may reach different API servers, and a watch
// from the current state or with initial events (WatchList) lists nothing
// first; hence the event check.

// errUnsharded marks a response the API server did not shard.
var errUnsharded = errors.New("the API server did not apply this pod's shardSelector")

// shardProof is what a range-mode request asked for: the hash ranges of the
// shardSelector sent.
type shardProof struct {
	ranges []sharding.HashRange
	// sent is the shardSelector parameter sent, the formatted ranges: a
	// list whose shardInfo echoes it byte for byte was filtered by exactly
	// these ranges, with no need to parse the echo.
	sent string
}

// covers reports whether the selector sent selects objects of namespace ns.
func (s shardProof) covers(ns string) bool {
	if ns == "" {
		return false
	}
	h := sharding.Hash(ns)
	return slices.ContainsFunc(s.ranges, func(r sharding.HashRange) bool { return r.Contains(h) })
}

// applied checks a list's metadata.shardInfo.selector: the server applied a
// selector, and it selects nothing the one sent does not.
func (s shardProof) applied(echoed string) error {
	if s.sent != "" && echoed == s.sent {
		return nil
	}
	ranges, err := sharding.ParseShardSelector(echoed)
	if err != nil {
		return fmt.Errorf("its metadata.shardInfo.selector %q: %w", echoed, err)
	}
	if !slices.Equal(sharding.IntersectRanges(ranges, s.ranges), ranges) {
		return fmt.Errorf("%w: its metadata.shardInfo.selector %q reaches outside the selector sent", errUnsharded, echoed)
	}
	return nil
}

// appliedBytes is applied for an echo read as bytes (protobuf), compared
// with the selector sent without copying it.
func (s shardProof) appliedBytes(echoed []byte) error {
	if s.sent != "" && string(echoed) == s.sent {
		return nil
	}
	return s.applied(string(echoed))
}

// object checks the namespace of one object of a response. An object
// without one — a Table or a list, whose metadata is a ListMeta — cannot be
// checked.
func (s shardProof) object(namespace string) error {
	switch {
	case namespace == "":
		return errors.New("it holds an object without metadata.namespace, which cannot be checked: ask for the objects themselves, not a Table")
	case !s.covers(namespace):
		return fmt.Errorf("%w: it holds an object of namespace %q, outside the shard", errUnsharded, namespace)
	}
	return nil
}

// protobufObject checks the namespace of one protobuf object of kind. Field
// 1 of a Table or a list is a ListMeta, whose field 3 is not a namespace but
// a continue token: they are refused by kind.
func (s shardProof) protobufObject(kind, namespace string) error {
	if kind == "Table" || strings.HasSuffix(kind, "List") {
		return fmt.Errorf("a %s cannot be checked object by object: ask for the objects themselves", kind)
	}
	return s.object(namespace)
}

// checkEvent is the watchstream.Check of a range-mode watch: the object of
// every ADDED, MODIFIED and DELETED event must be in a namespace the
// selector covers. BOOKMARK and ERROR events carry no object of the
// resource.
func (s shardProof) checkEvent(framing watchstream.Framing, frame []byte) error {
	var typ string
	var check func() error
	switch framing {
	case watchstream.JSON:
		var ev struct {
			Type   string `json:"type"`
			Object struct {
				Metadata struct {
					Namespace string `json:"namespace"`
				} `json:"metadata"`
			} `json:"object"`
		}
		if err := decodeJSON(frame, &ev); err != nil {
			return fmt.Errorf("cannot read a watch event: %w", err)
		}
		typ, check = ev.Type, func() error { return s.object(ev.Object.Metadata.Namespace) }
	case watchstream.Protobuf:
		t, kind, namespace, err := protobufEvent(frame)
		if err != nil {
			return fmt.Errorf("cannot read a watch event: %w", err)
		}
		typ, check = t, func() error { return s.protobufObject(kind, namespace) }
	default:
		return fmt.Errorf("cannot read watch events framed as %v", framing)
	}
	switch typ {
	case "BOOKMARK", "ERROR":
		return nil
	case "ADDED", "MODIFIED", "DELETED":
		if err := check(); err != nil {
			return fmt.Errorf("%s event: %w", typ, err)
		}
		return nil
	default:
		return fmt.Errorf("unknown watch event type %q", typ)
	}
}

// protobufEvent reads a protobuf watch event frame: a 4-byte length, then a
// metav1.WatchEvent{type: 1, object: 2 (runtime.RawExtension{raw: 1})}
// whose raw is an enveloped object.
func protobufEvent(frame []byte) (typ, kind, namespace string, err error) {
	if len(frame) < 4 {
		return "", "", "", errors.New("frame shorter than its length prefix")
	}
	fields, err := protoFields(frame[4:], 1, 2)
	if err != nil {
		return "", "", "", err
	}
	typ = string(fields[1])
	raw, err := protoFields(fields[2], 1)
	if err != nil {
		return "", "", "", err
	}
	kind, object, err := protobufEnvelope(raw[1])
	if err != nil {
		return "", "", "", err
	}
	namespace, err = protobufNamespace(object)
	return typ, kind, namespace, err
}

// protobufMagic starts every object kube-apiserver encodes in protobuf.
var protobufMagic = []byte("k8s\x00")

// protobufEnvelope reads an enveloped object: the magic, then a
// runtime.Unknown{typeMeta: 1 {apiVersion: 1, kind: 2}, raw: 2}.
func protobufEnvelope(data []byte) (kind string, raw []byte, err error) {
	rest, ok := bytes.CutPrefix(data, protobufMagic)
	if !ok {
		return "", nil, errors.New("not an enveloped Kubernetes protobuf object")
	}
	fields, err := protoFields(rest, 1, 2)
	if err != nil {
		return "", nil, err
	}
	typeMeta, err := protoFields(fields[1], 2)
	if err != nil {
		return "", nil, err
	}
	return string(typeMeta[2]), fields[2], nil
}

// protobufNamespace reads metadata.namespace of an object: field 1 is its
// ObjectMeta in every Kubernetes object message, and namespace is field 3
// of ObjectMeta.
func protobufNamespace(object []byte) (string, error) {
	fields, err := protoFields(object, 1)
	if err != nil {
		return "", err
	}
	meta, err := protoFields(fields[1], 3)
	if err != nil {
		return "", err
	}
	return string(meta[3]), nil
}

// protoFields returns the length-delimited fields nums of a protobuf
// message (absent ones as nil), skipping the others. A wanted field that
// appears twice is an error: the proxy would have to merge as protobuf does,
// and kube-apiserver never writes one twice.
func protoFields(msg []byte, nums ...protowire.Number) (map[protowire.Number][]byte, error) {
	out := make(map[protowire.Number][]byte, len(nums))
	for len(msg) > 0 {
		num, typ, n := protowire.ConsumeTag(msg)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		msg = msg[n:]
		if !slices.Contains(nums, num) {
			if n = protowire.ConsumeFieldValue(num, typ, msg); n < 0 {
				return nil, protowire.ParseError(n)
			}
			msg = msg[n:]
			continue
		}
		if typ != protowire.BytesType {
			return nil, fmt.Errorf("protobuf field %d has wire type %d, not length-delimited", num, typ)
		}
		if _, seen := out[num]; seen {
			return nil, fmt.Errorf("protobuf field %d appears twice", num)
		}
		v, n := protowire.ConsumeBytes(msg)
		if n < 0 {
			return nil, protowire.ParseError(n)
		}
		out[num] = v
		msg = msg[n:]
	}
	return out, nil
}

// Bounds of what the list check reads into memory at once.
const (
	// listCheckAhead is how much of a list the proxy reads before it
	// answers: enough for a typed list's metadata, and for the first items
	// of an unsharded one, so that a refusal is usually a clean 503 rather
	// than a response cut short.
	listCheckAhead = 256 << 10
	// maxListMeta bounds the list's type and list metadata (protobuf).
	maxListMeta = 1 << 20
	// maxListItem bounds one item (protobuf); kube-apiserver's own request
	// limit keeps objects far below it.
	maxListItem = 64 << 20
)

// listWalker reads a list response up to its next decision point.
type listWalker interface {
	// next reads on and returns the stream offset before which the list
	// is checked, and proven when the whole list may be handed on. An
	// error refuses the rest.
	next() (checked int64, proven bool, err error)
}

// checkedBody is the body of a range-mode list response as the operator
// receives it: upstream bytes, handed on only as far as they are checked.
// A refusal after the first bytes were handed on ends the body with an
// error, which ReverseProxy turns into a cut response: the operator sees an
// error, never an object outside its shard.
type checkedBody struct {
	upstream io.ReadCloser
	walker   listWalker
	// held is what was read from upstream and not yet handed on; its first
	// byte is at stream offset heldAt.
	held    *bytes.Buffer
	heldAt  int64
	checked int64
	proven  bool
	err     error
	// refused is called once, with the error that refused the list.
	refused func(error)
}

// checkList prepares the 200 response to a range-mode list: it reads the
// list until it is proven or refused, or listCheckAhead bytes are held (an
// error refuses the list before anything is handed on), and replaces its
// body with what hands the rest on only as far as it is checked.
//
// A gzip-compressed list — the operator accepted gzip, so the proxy asked
// for it (serveRead) — is decoded for the check. Once proven from its
// first bytes (a typed list's shardInfo), or read to its end and every item
// checked, within the read-ahead, the compressed bytes go on as the API
// server sent them, so the proxy neither decodes the rest nor sends it
// plain: the operator decodes the very stream the proxy checked. A list
// that must be checked item by item further on is handed on decoded, as
// far as checked, without Content-Encoding.
func checkList(resp *http.Response, proof shardProof, refused func(error)) error {
	if resp.Header.Get("Content-Encoding") != "gzip" {
		body, err := checkAhead(resp, proof, refused, nil)
		if err != nil {
			return err
		}
		resp.Body = body
		return nil
	}
	upstream := resp.Body
	compressed := &recorder{}
	decoder := listGzips.Get().(*listGzip)
	decoded, err := decoder.reset(io.TeeReader(upstream, compressed))
	if err != nil {
		decoder.release()
		err = fmt.Errorf("cannot read the gzip-compressed list: %w", err)
		refused(err)
		return err
	}
	plain := &http.Response{StatusCode: resp.StatusCode, Header: resp.Header.Clone(), Body: readCloser{Reader: decoded, Closer: upstream}}
	plain.Header.Del("Content-Encoding")
	body, err := checkAhead(plain, proof, refused, &decoder.scratch)
	if err != nil {
		decoder.release()
		return err
	}
	if body.proven {
		// Decided, and handed on compressed: nothing reads the decoded
		// body, the decoder or its scratch again.
		decoder.release()
		resp.Body = readCloser{Reader: io.MultiReader(&compressed.buf, upstream), Closer: upstream}
		return nil
	}
	// The decoder and its scratch go on with the decoded body; the garbage
	// collector takes them.
	compressed.stop()
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Body = body
	return nil
}

// listGzip decodes a gzip-compressed list for the check. Pooled (listGzips)
// and reset for each list, it costs a list no allocation: a new gzip reader
// allocates its 32 KiB window, its Huffman tables and a 4 KiB input buffer.
// A decoder goes back to the pool only once its list is decided — proven
// and handed on compressed, or refused — so that nothing reads it again;
// one that goes on with a body decoded further is left to the garbage
// collector. Reset clears any error of its previous list.
type listGzip struct {
	// in buffers the compressed stream: a flate.Reader, which gzip.Reader
	// reads as it is rather than wrapping it in a new bufio.Reader.
	in bufio.Reader
	gz gzip.Reader
	// scratch serves the check of the decoded list.
	scratch listScratch
}

var listGzips = sync.Pool{New: func() any { return new(listGzip) }}

// reset starts decoding the gzip stream r, reading its header.
func (d *listGzip) reset(r io.Reader) (io.Reader, error) {
	d.in.Reset(r)
	if err := d.gz.Reset(&d.in); err != nil {
		return nil, err
	}
	return &d.gz, nil
}

// release returns the decoder to the pool, holding no reference to its
// list's streams.
func (d *listGzip) release() {
	d.in.Reset(nil)
	d.scratch.reset(nil)
	listGzips.Put(d)
}

// listScratch is the buffers the check of one list needs: what was read
// and not yet handed on, and the protobuf walker's input buffer.
type listScratch struct {
	held bytes.Buffer
	in   bufio.Reader
}

func (s *listScratch) reset(r io.Reader) {
	s.held.Reset()
	s.in.Reset(r)
}

// checkAhead starts checking the list resp carries, plain, and reads it
// until it is proven or refused, or listCheckAhead bytes are held; a list
// that cannot be read is refused. scratch, when not nil, is the buffers to
// check it with.
func checkAhead(resp *http.Response, proof shardProof, refused func(error), scratch *listScratch) (*checkedBody, error) {
	body, err := newCheckedBody(resp, proof, refused, scratch)
	if err != nil {
		refused(err)
		return nil, err
	}
	return body, body.readAhead(listCheckAhead)
}

// recorder keeps what is written to it until stopped.
type recorder struct {
	buf     bytes.Buffer
	stopped bool
}

func (r *recorder) Write(p []byte) (int, error) {
	if !r.stopped {
		r.buf.Write(p)
	}
	return len(p), nil
}

func (r *recorder) stop() {
	r.stopped = true
	r.buf = bytes.Buffer{}
}

// newCheckedBody wraps the body of a list response in JSON or protobuf,
// as sent (not compressed), checked with scratch's buffers (new ones when
// nil).
func newCheckedBody(resp *http.Response, proof shardProof, refused func(error), scratch *listScratch) (*checkedBody, error) {
	if ce := resp.Header.Get("Content-Encoding"); ce != "" && ce != "identity" {
		return nil, fmt.Errorf("cannot read a list sent with Content-Encoding %q", ce)
	}
	if scratch == nil {
		scratch = new(listScratch)
	}
	scratch.held.Reset()
	b := &checkedBody{upstream: resp.Body, held: &scratch.held, refused: refused}
	source := io.TeeReader(resp.Body, b.held)
	mediaType, _, err := mime.ParseMediaType(resp.Header.Get("Content-Type"))
	switch {
	case err != nil:
		return nil, fmt.Errorf("cannot read a list of Content-Type %q: %w", resp.Header.Get("Content-Type"), err)
	case mediaType == "application/json":
		b.walker = &jsonListWalker{dec: json.NewDecoder(source), proof: proof, unchecked: -1}
	case mediaType == "application/vnd.kubernetes.protobuf":
		scratch.in.Reset(source)
		b.walker = &protobufListWalker{r: &scratch.in, proof: proof, unchecked: -1}
	default:
		return nil, fmt.Errorf("cannot read a list of Content-Type %q", resp.Header.Get("Content-Type"))
	}
	return b, nil
}

// readAhead checks the list until it is proven or refused, or until limit
// bytes are held: a refusal found here is the answer, and nothing was
// handed on.
func (b *checkedBody) readAhead(limit int) error {
	for !b.proven && b.err == nil && b.held.Len() < limit {
		b.step()
	}
	return b.err
}

func (b *checkedBody) step() {
	checked, proven, err := b.walker.next()
	b.checked = max(b.checked, checked)
	b.proven = proven
	if err != nil {
		b.err = err
		b.refused(err)
	}
}

func (b *checkedBody) Read(p []byte) (int, error) {
	for len(p) > 0 {
		if b.proven {
			if b.held.Len() > 0 {
				return b.held.Read(p)
			}
			return b.upstream.Read(p)
		}
		if n := b.checked - b.heldAt; n > 0 {
			k, _ := b.held.Read(p[:min(int64(len(p)), n)])
			b.heldAt += int64(k)
			return k, nil
		}
		if b.err != nil {
			return 0, b.err
		}
		b.step()
	}
	return 0, nil
}

func (b *checkedBody) Close() error { return b.upstream.Close() }

// jsonListWalker walks a JSON list: {"kind", "apiVersion", "metadata",
// "items": [...]} in any order.
type jsonListWalker struct {
	dec   *json.Decoder
	proof shardProof
	state int
	// items is true once the list's items were all checked.
	items bool
	// unchecked is the offset of the first value that could not be
	// checked (uncheckedKey's), -1 while there is none: nothing from it on
	// is handed on unless shardInfo proves the whole list.
	unchecked    int64
	uncheckedKey string
}

const (
	jsonStart = iota
	jsonFields
	jsonItems
)

func (w *jsonListWalker) checkedTo() int64 {
	if w.unchecked >= 0 {
		return w.unchecked
	}
	return w.dec.InputOffset()
}

func (w *jsonListWalker) next() (int64, bool, error) {
	switch w.state {
	case jsonStart:
		if err := w.delim('{'); err != nil {
			return 0, false, err
		}
		w.state = jsonFields
	case jsonFields:
		if !w.dec.More() {
			if err := w.delim('}'); err != nil {
				return 0, false, err
			}
			return w.end()
		}
		tok, err := w.dec.Token()
		if err != nil {
			return 0, false, err
		}
		switch key, _ := tok.(string); key {
		case "metadata":
			var md struct {
				ShardInfo *struct {
					Selector string `json:"selector"`
				} `json:"shardInfo"`
			}
			if err := w.decode(&md); err != nil {
				return 0, false, err
			}
			if md.ShardInfo != nil {
				if err := w.proof.applied(md.ShardInfo.Selector); err != nil {
					return 0, false, err
				}
				return w.checkedTo(), true, nil
			}
		case "items":
			tok, err := w.dec.Token()
			switch {
			case err != nil:
				return 0, false, err
			case tok == nil: // "items": null, an empty list
				w.items = true
			case tok == json.Delim('['):
				w.state = jsonItems
			default:
				return 0, false, fmt.Errorf("the list's items are %v, not an array", tok)
			}
		case "kind", "apiVersion":
			var s string
			if err := w.dec.Decode(&s); err != nil {
				return 0, false, err
			}
		default:
			if w.unchecked < 0 {
				w.unchecked, w.uncheckedKey = w.dec.InputOffset(), key
			}
			var skip json.RawMessage
			if err := w.dec.Decode(&skip); err != nil {
				return 0, false, err
			}
		}
	case jsonItems:
		if !w.dec.More() {
			if err := w.delim(']'); err != nil {
				return 0, false, err
			}
			w.state, w.items = jsonFields, true
			break
		}
		var item struct {
			Metadata struct {
				Namespace string `json:"namespace"`
			} `json:"metadata"`
		}
		if err := w.decode(&item); err != nil {
			return 0, false, err
		}
		if err := w.proof.object(item.Metadata.Namespace); err != nil {
			return 0, false, err
		}
	}
	return w.checkedTo(), false, nil
}

// decode decodes the next value into v as client-go would (decodeJSON).
func (w *jsonListWalker) decode(v any) error {
	var raw json.RawMessage
	if err := w.dec.Decode(&raw); err != nil {
		return err
	}
	return decodeJSON(raw, v)
}

// decodeJSON decodes as kube-apiserver's clients do: keys match their
// fields case-sensitively, and the last of duplicate keys wins. A decoder
// that read {"namespace": "b", "Namespace": "a"} as namespace "a", as
// encoding/json does, would let the operator see an object of "b".
func decodeJSON(data []byte, v any) error {
	return kjson.UnmarshalCaseSensitivePreserveInts(data, v)
}

func (w *jsonListWalker) delim(want json.Delim) error {
	tok, err := w.dec.Token()
	if err != nil {
		return err
	}
	if tok != want {
		return fmt.Errorf("expected %v in the list, found %v", want, tok)
	}
	return nil
}

// end decides a list that carried no shardInfo.
func (w *jsonListWalker) end() (int64, bool, error) {
	switch {
	case w.unchecked >= 0:
		return 0, false, fmt.Errorf("the response carries no metadata.shardInfo, and its %q cannot be checked object by object: ask for the objects themselves, not a Table", w.uncheckedKey)
	case !w.items:
		return 0, false, errors.New("the response carries no metadata.shardInfo, and no items to check")
	}
	return w.checkedTo(), true, nil
}

// protobufListWalker walks a protobuf list: the magic, then a
// runtime.Unknown{typeMeta: 1, raw: 2, contentEncoding: 3, contentType: 4}
// whose raw is the list message {metadata: 1 (ListMeta), items: 2...}.
type protobufListWalker struct {
	r     *bufio.Reader
	proof shardProof
	// n counts the bytes read.
	n     int64
	state int
	// listEnd is the offset where the list message ends.
	listEnd int64
	kind    string
	items   bool
	// unchecked, uncheckedField: as for JSON.
	unchecked      int64
	uncheckedField string
	// value holds the last value read (bytes), reused: what the walker
	// keeps of one, it copies.
	value []byte
}

const (
	protobufStart = iota
	protobufInEnvelope
	protobufInList
)

func (w *protobufListWalker) checkedTo() int64 {
	if w.unchecked >= 0 {
		return w.unchecked
	}
	return w.n
}

func (w *protobufListWalker) next() (int64, bool, error) {
	switch w.state {
	case protobufStart:
		magic := make([]byte, len(protobufMagic))
		if _, err := io.ReadFull(w, magic); err != nil {
			return 0, false, err
		}
		if !bytes.Equal(magic, protobufMagic) {
			return 0, false, errors.New("the list is not an enveloped Kubernetes protobuf object")
		}
		w.state = protobufInEnvelope
	case protobufInEnvelope:
		if _, err := w.r.Peek(1); err == io.EOF {
			return w.end()
		}
		num, typ, err := w.tag()
		if err != nil {
			return 0, false, err
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			typeMeta, err := w.bytes(maxListMeta)
			if err != nil {
				return 0, false, err
			}
			fields, err := protoFields(typeMeta, 2)
			if err != nil {
				return 0, false, err
			}
			w.kind = string(fields[2])
		case num == 2 && typ == protowire.BytesType:
			size, err := binary.ReadUvarint(w)
			if err != nil {
				return 0, false, err
			}
			w.listEnd, w.state = w.n+int64(size), protobufInList
		case (num == 3 || num == 4) && typ == protowire.BytesType:
			// contentEncoding and contentType, which kube-apiserver
			// leaves empty.
			if _, err := w.bytes(maxListMeta); err != nil {
				return 0, false, err
			}
		default:
			if err := w.skipUnchecked(num, typ, "envelope"); err != nil {
				return 0, false, err
			}
		}
	case protobufInList:
		if w.n >= w.listEnd {
			if w.n > w.listEnd {
				return 0, false, errors.New("the list's fields overrun its length")
			}
			w.state, w.items = protobufInEnvelope, true
			break
		}
		num, typ, err := w.tag()
		if err != nil {
			return 0, false, err
		}
		switch {
		case num == 1 && typ == protowire.BytesType:
			listMeta, err := w.bytes(maxListMeta)
			if err != nil {
				return 0, false, err
			}
			fields, err := protoFields(listMeta, 5)
			if err != nil {
				return 0, false, err
			}
			if shardInfo := fields[5]; shardInfo != nil {
				selector, err := protoFields(shardInfo, 1)
				if err != nil {
					return 0, false, err
				}
				if err := w.proof.appliedBytes(selector[1]); err != nil {
					return 0, false, err
				}
				return w.checkedTo(), true, nil
			}
		case num == 2 && typ == protowire.BytesType && strings.HasSuffix(w.kind, "List"):
			item, err := w.bytes(maxListItem)
			if err != nil {
				return 0, false, err
			}
			namespace, err := protobufNamespace(item)
			if err != nil {
				return 0, false, err
			}
			if err := w.proof.object(namespace); err != nil {
				return 0, false, err
			}
		default:
			if err := w.skipUnchecked(num, typ, "list"); err != nil {
				return 0, false, err
			}
		}
	}
	return w.checkedTo(), false, nil
}

// end decides a list that carried no shardInfo.
func (w *protobufListWalker) end() (int64, bool, error) {
	switch {
	case w.unchecked >= 0:
		return 0, false, fmt.Errorf("the %s carries no metadata.shardInfo, and its %s cannot be checked object by object: ask for the objects themselves, not a Table", w.kind, w.uncheckedField)
	case !w.items:
		return 0, false, fmt.Errorf("the %s carries no metadata.shardInfo, and no items to check", w.kind)
	}
	return w.checkedTo(), true, nil
}

// Read and ReadByte read the body, counting.
func (w *protobufListWalker) Read(p []byte) (int, error) {
	n, err := w.r.Read(p)
	w.n += int64(n)
	return n, err
}

func (w *protobufListWalker) ReadByte() (byte, error) {
	c, err := w.r.ReadByte()
	if err == nil {
		w.n++
	}
	return c, err
}

func (w *protobufListWalker) tag() (protowire.Number, protowire.Type, error) {
	v, err := binary.ReadUvarint(w)
	if err != nil {
		return 0, 0, unexpectedEOF(err)
	}
	num, typ := protowire.DecodeTag(v)
	if num < protowire.MinValidNumber {
		return 0, 0, fmt.Errorf("invalid protobuf field number %d", num)
	}
	return num, typ, nil
}

// bytes reads a length-delimited value of at most limit bytes, valid until
// the next call.
func (w *protobufListWalker) bytes(limit int64) ([]byte, error) {
	size, err := binary.ReadUvarint(w)
	if err != nil {
		return nil, unexpectedEOF(err)
	}
	if size > uint64(limit) {
		return nil, fmt.Errorf("a field of %d bytes is larger than the proxy reads at once (%d)", size, limit)
	}
	if uint64(cap(w.value)) < size {
		w.value = make([]byte, size)
	}
	v := w.value[:size]
	if _, err := io.ReadFull(w, v); err != nil {
		return nil, unexpectedEOF(err)
	}
	return v, nil
}

// skipUnchecked skips a field the walker cannot check, remembering where.
func (w *protobufListWalker) skipUnchecked(num protowire.Number, typ protowire.Type, where string) error {
	if w.unchecked < 0 {
		// From after the tag: a tag alone holds nothing of an object.
		w.unchecked, w.uncheckedField = w.n, fmt.Sprintf("%s field %d", where, num)
	}
	var skip int64
	switch typ {
	case protowire.VarintType:
		_, err := binary.ReadUvarint(w)
		return unexpectedEOF(err)
	case protowire.Fixed32Type:
		skip = 4
	case protowire.Fixed64Type:
		skip = 8
	case protowire.BytesType:
		size, err := binary.ReadUvarint(w)
		if err != nil {
			return unexpectedEOF(err)
		}
		skip = int64(size)
	default:
		return fmt.Errorf("protobuf field %d has unsupported wire type %d", num, typ)
	}
	_, err := io.CopyN(io.Discard, w, skip)
	return unexpectedEOF(err)
}

// unexpectedEOF turns io.EOF inside a value into io.ErrUnexpectedEOF.
func unexpectedEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
