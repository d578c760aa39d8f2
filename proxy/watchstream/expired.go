package watchstream

import (
	"bytes"
	"fmt"
	"net/http"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	"k8s.io/apimachinery/pkg/watch"
)

// expiredEvent returns one framed ERROR watch event whose object is a 410
// Expired metav1.Status: the event client-go reflectors relist on.
func expiredEvent(framing Framing, msg string) ([]byte, error) {
	return errorEvent(framing, &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusGone,
		Reason:  metav1.StatusReasonExpired,
		Message: msg,
	})
}

// refusedEvent returns one framed ERROR watch event whose object is a 503
// ServiceUnavailable metav1.Status: the watch ends, and client-go reflectors
// relist after their backoff.
func refusedEvent(framing Framing, msg string) ([]byte, error) {
	return errorEvent(framing, &metav1.Status{
		Status:  metav1.StatusFailure,
		Code:    http.StatusServiceUnavailable,
		Reason:  metav1.StatusReasonServiceUnavailable,
		Message: msg,
	})
}

// errorEvent returns one framed ERROR watch event carrying status, encoded
// the way kube-apiserver encodes watch events
// (k8s.io/apiserver/pkg/endpoints/handlers: watchEncoder.doEncode): the
// object with the media type's serializer, wrapped in a metav1.WatchEvent
// encoded with its stream serializer, written through its framer. For
// protobuf that is a 4-byte length, then the raw (un-enveloped) WatchEvent
// whose Object.Raw is "k8s\x00" and a runtime.Unknown holding the Status.
//
// The scheme is built per call: it is needed only when a watch is ended,
// and the package keeps no shared state.
func errorEvent(framing Framing, status *metav1.Status) ([]byte, error) {
	var mediaType string
	switch framing {
	case JSON:
		mediaType = MediaTypeJSON
	case Protobuf:
		mediaType = MediaTypeProtobuf
	default:
		return nil, fmt.Errorf("watchstream: unknown framing %v", framing)
	}

	// metav1.Status is served as "v1" in every API group, and the watch event
	// is not typed on the wire; register just these two, as
	// metav1.AddToGroupVersion does for the core group.
	gv := schema.GroupVersion{Version: "v1"}
	scheme := runtime.NewScheme()
	scheme.AddKnownTypes(gv, &metav1.WatchEvent{})
	scheme.AddUnversionedTypes(metav1.Unversioned, &metav1.Status{})
	codecs := serializer.NewCodecFactory(scheme)
	info, ok := runtime.SerializerInfoForMediaType(codecs.SupportedMediaTypes(), mediaType)
	if !ok || info.StreamSerializer == nil || info.StreamSerializer.Framer == nil {
		return nil, fmt.Errorf("watchstream: no stream serializer for %s", mediaType)
	}

	var object bytes.Buffer
	if err := codecs.EncoderForVersion(info.Serializer, gv).Encode(status, &object); err != nil {
		return nil, fmt.Errorf("watchstream: encoding the %d status: %w", status.Code, err)
	}
	event := &metav1.WatchEvent{
		Type:   string(watch.Error),
		Object: runtime.RawExtension{Raw: object.Bytes()},
	}
	var encoded bytes.Buffer
	if err := codecs.EncoderForVersion(info.StreamSerializer.Serializer, gv).Encode(event, &encoded); err != nil {
		return nil, fmt.Errorf("watchstream: encoding the ERROR watch event: %w", err)
	}
	var out bytes.Buffer
	if _, err := info.StreamSerializer.Framer.NewFrameWriter(&out).Write(encoded.Bytes()); err != nil {
		return nil, fmt.Errorf("watchstream: framing the ERROR watch event: %w", err)
	}
	return out.Bytes(), nil
}
