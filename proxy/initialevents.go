package proxy

import (
	"bytes"
	"encoding/binary"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/ctrlmesh/ctrlmesh/proxy/watchstream"
)

// initialEventsEnd tells whether frame, one watch event in framing, is the
// bookmark that ends a watch's initial events (sendInitialEvents): its
// object's annotation k8s.io/initial-events-end is "true". On it a client-go
// reflector replaces its cache with the events before it, as it does with a
// list. Whatever it cannot read is not that bookmark: the proxy then goes
// on waiting for the operator to take up its rules.
//
// The frame is read with apimachinery's own types: metav1.WatchEvent, the
// protobuf envelope runtime.Unknown, and metav1.PartialObjectMetadata,
// whose metadata field (1 in protobuf) every object shares.
func initialEventsEnd(framing watchstream.Framing, frame []byte) bool {
	// Every frame of a watch's initial events passes here: all but the
	// bookmark leave at this scan.
	if !bytes.Contains(frame, []byte(metav1.InitialEventsAnnotationKey)) {
		return false
	}
	var ev metav1.WatchEvent
	var object metav1.PartialObjectMetadata
	switch framing {
	case watchstream.JSON:
		if decodeJSON(frame, &ev) != nil || ev.Type != "BOOKMARK" || decodeJSON(ev.Object.Raw, &object) != nil {
			return false
		}
	case watchstream.Protobuf:
		// A 4-byte length of the rest (the frame reader's), the event, its
		// object enveloped.
		if len(frame) < 4 || int(binary.BigEndian.Uint32(frame)) != len(frame)-4 || ev.Unmarshal(frame[4:]) != nil || ev.Type != "BOOKMARK" {
			return false
		}
		enveloped, ok := bytes.CutPrefix(ev.Object.Raw, protobufMagic)
		var unknown runtime.Unknown
		if !ok || unknown.Unmarshal(enveloped) != nil || object.Unmarshal(unknown.Raw) != nil {
			return false
		}
	default:
		return false
	}
	return object.Annotations[metav1.InitialEventsAnnotationKey] == "true"
}
