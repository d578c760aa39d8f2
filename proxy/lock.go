package proxy

import (
	"encoding/json"
	"fmt"
	"mime"
	"slices"
	"strings"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
)

// lockResources are the kinds client-go's leader election can lock on.
var lockResources = []schema.GroupResource{
	{Group: "coordination.k8s.io", Resource: "leases"},
	{Group: "", Resource: "configmaps"},
	{Group: "", Resource: "endpoints"},
}

func isLockResource(gr schema.GroupResource) bool { return slices.Contains(lockResources, gr) }

// lockScheme knows the kinds of lockResources, whose protobuf bodies the
// proxy decodes to rename: those and no others, for a scheme of every API
// would cost each sidecar memory for types it never decodes.
func lockScheme() (*runtime.Scheme, error) {
	s := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{coordinationv1.AddToScheme, corev1.AddToScheme} {
		if err := add(s); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// renameNameSegment replaces the object-name segment of an API path. parts
// are the path segments RequestInfo found after the group, version and
// namespace — resource, name, subresource… — so the name is the segment
// len(parts)-1 from the end. Only that one segment changes: never the
// namespace, even when it is spelled like the lock (the seed project's bug).
func renameNameSegment(path string, parts []string, name, newName string) (string, error) {
	segs := strings.Split(path, "/")
	if len(parts) < 2 {
		return "", fmt.Errorf("path %q names no object", path)
	}
	idx := len(segs) - len(parts) + 1
	if idx < 1 || idx >= len(segs) || segs[idx] != name || segs[idx-1] != parts[0] {
		return "", fmt.Errorf("path %q: object name %q not where expected", path, name)
	}
	segs[idx] = newName
	return strings.Join(segs, "/"), nil
}

// renameFieldSelector rewrites metadata.name=<lock> in a field selector; it
// reports whether it did.
func renameFieldSelector(selector, name, newName string) (string, bool, error) {
	if selector == "" {
		return selector, false, nil
	}
	sel, err := fields.ParseSelector(selector)
	if err != nil {
		return "", false, fmt.Errorf("fieldSelector %q: %w", selector, err)
	}
	renamed := false
	out, err := sel.Transform(func(field, value string) (string, string, error) {
		if field == "metadata.name" && value == name {
			renamed = true
			return field, newName, nil
		}
		return field, value, nil
	})
	if err != nil {
		return "", false, err
	}
	return out.String(), renamed, nil
}

// bodyRenamer reads and rewrites metadata.name of request bodies in the
// encodings client-go sends: JSON (handled as generic JSON, so fields this
// build does not know survive) and protobuf (through the space).
type bodyRenamer struct {
	codecs serializer.CodecFactory
}

// name returns metadata.name of the body.
func (b bodyRenamer) name(contentType string, body []byte) (string, error) {
	if isJSON(contentType) {
		var obj struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(body, &obj); err != nil {
			return "", fmt.Errorf("decoding the JSON body: %w", err)
		}
		return obj.Metadata.Name, nil
	}
	obj, _, err := b.decoder(contentType)
	if err != nil {
		return "", err
	}
	decoded, _, err := obj.Decode(body, nil, nil)
	if err != nil {
		return "", fmt.Errorf("decoding the %s body: %w", contentType, err)
	}
	acc, err := meta.Accessor(decoded)
	if err != nil {
		return "", err
	}
	return acc.GetName(), nil
}

// rename sets metadata.name of the body to newName.
func (b bodyRenamer) rename(contentType string, body []byte, newName string) ([]byte, error) {
	if isJSON(contentType) {
		var obj map[string]any
		if err := json.Unmarshal(body, &obj); err != nil {
			return nil, fmt.Errorf("decoding the JSON body: %w", err)
		}
		md, ok := obj["metadata"].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("the JSON body has no metadata object")
		}
		md["name"] = newName
		return json.Marshal(obj)
	}
	dec, ser, err := b.decoder(contentType)
	if err != nil {
		return nil, err
	}
	decoded, _, err := dec.Decode(body, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("decoding the %s body: %w", contentType, err)
	}
	acc, err := meta.Accessor(decoded)
	if err != nil {
		return nil, err
	}
	acc.SetName(newName)
	var sb strings.Builder
	if err := ser.Encode(decoded, &sb); err != nil {
		return nil, fmt.Errorf("encoding the %s body: %w", contentType, err)
	}
	return []byte(sb.String()), nil
}

func (b bodyRenamer) decoder(contentType string) (runtime.Decoder, runtime.Encoder, error) {
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return nil, nil, fmt.Errorf("content type %q: %w", contentType, err)
	}
	info, ok := runtime.SerializerInfoForMediaType(b.codecs.SupportedMediaTypes(), mediaType)
	if !ok {
		return nil, nil, fmt.Errorf("content type %q is not supported for lock objects", contentType)
	}
	return info.Serializer, info.Serializer, nil
}

func isJSON(contentType string) bool {
	mediaType, _, err := mime.ParseMediaType(contentType)
	return err == nil && (mediaType == "application/json" || strings.HasSuffix(mediaType, "+json"))
}
