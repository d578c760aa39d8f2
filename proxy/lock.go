package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"mime"
	"slices"
	"strings"

	"google.golang.org/protobuf/encoding/protowire"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/yaml"

	"github.com/ctrlmesh/ctrlmesh/proxy/watchstream"
)

// lockResources are the kinds client-go's leader election can lock on.
var lockResources = []schema.GroupResource{
	{Group: "coordination.k8s.io", Resource: "leases"},
	{Group: "", Resource: "configmaps"},
	{Group: "", Resource: "endpoints"},
}

func isLockResource(gr schema.GroupResource) bool { return slices.Contains(lockResources, gr) }

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
// encodings clients send: JSON (handled as generic JSON, so fields this
// build does not know survive), Kubernetes protobuf (field by field: every
// object's metadata is field 1 and its name field 1 of that, so the bytes
// of every other field pass as they came, whatever the kind) and, to read
// a name only, YAML. It decodes no typed object, so the proxy links no API
// types for it.
type bodyRenamer struct{}

// name returns metadata.name of the body.
func (b bodyRenamer) name(contentType string, body []byte) (string, error) {
	mediaType, err := bodyMediaType(contentType)
	if err != nil {
		return "", err
	}
	switch {
	case mediaType == mediaTypeYAML:
		if body, err = yaml.YAMLToJSON(body); err != nil {
			return "", fmt.Errorf("decoding the YAML body: %w", err)
		}
		fallthrough
	case isJSONMediaType(mediaType):
		var obj struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(body, &obj); err != nil {
			return "", fmt.Errorf("decoding the JSON body: %w", err)
		}
		return obj.Metadata.Name, nil
	case mediaType == watchstream.MediaTypeProtobuf:
		_, metadata, err := protobufMetadata(body)
		if err != nil {
			return "", fmt.Errorf("decoding the protobuf body: %w", err)
		}
		fields, err := protoFields(metadata, 1)
		if err != nil {
			return "", fmt.Errorf("decoding the protobuf body's metadata: %w", err)
		}
		return string(fields[1]), nil
	}
	return "", fmt.Errorf("content type %q is not supported for named objects: send JSON or protobuf", contentType)
}

// rename sets metadata.name of the body to newName.
func (b bodyRenamer) rename(contentType string, body []byte, newName string) ([]byte, error) {
	mediaType, err := bodyMediaType(contentType)
	if err != nil {
		return nil, err
	}
	switch {
	case isJSONMediaType(mediaType):
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
	case mediaType == watchstream.MediaTypeProtobuf:
		envelope, metadata, err := protobufMetadata(body)
		if err != nil {
			return nil, fmt.Errorf("decoding the protobuf body: %w", err)
		}
		if metadata, err = setProtoField(metadata, 1, []byte(newName)); err != nil {
			return nil, fmt.Errorf("renaming in the protobuf body's metadata: %w", err)
		}
		raw := envelope[2]
		if raw, err = setProtoField(raw, 1, metadata); err != nil {
			return nil, err
		}
		unknown, err := setProtoField(bytes.TrimPrefix(body, protobufMagic), 2, raw)
		if err != nil {
			return nil, err
		}
		return append(bytes.Clone(protobufMagic), unknown...), nil
	}
	return nil, fmt.Errorf("content type %q is not supported for lock objects: send JSON or protobuf", contentType)
}

// protobufMetadata reads an enveloped protobuf object: the envelope's
// fields (runtime.Unknown: 2 is the object) and the object's metadata.
func protobufMetadata(body []byte) (map[protowire.Number][]byte, []byte, error) {
	unknown, ok := bytes.CutPrefix(body, protobufMagic)
	if !ok {
		return nil, nil, errors.New("not an enveloped Kubernetes protobuf object")
	}
	envelope, err := protoFields(unknown, 2)
	if err != nil {
		return nil, nil, err
	}
	object, err := protoFields(envelope[2], 1)
	if err != nil {
		return nil, nil, err
	}
	if object[1] == nil {
		return nil, nil, errors.New("the object has no metadata")
	}
	return envelope, object[1], nil
}

// setProtoField sets the length-delimited field num of a protobuf message
// to value, where it was, or at the end when it was absent; every other
// field's bytes stay as they were. A field num twice, or of another wire
// type, is an error (see protoFields).
func setProtoField(msg []byte, num protowire.Number, value []byte) ([]byte, error) {
	out := make([]byte, 0, len(msg)+len(value)+8)
	found := false
	for rest := msg; len(rest) > 0; {
		n, typ, tagLen := protowire.ConsumeTag(rest)
		if tagLen < 0 {
			return nil, protowire.ParseError(tagLen)
		}
		valueLen := protowire.ConsumeFieldValue(n, typ, rest[tagLen:])
		if valueLen < 0 {
			return nil, protowire.ParseError(valueLen)
		}
		if n == num {
			if typ != protowire.BytesType {
				return nil, fmt.Errorf("protobuf field %d has wire type %d, not length-delimited", num, typ)
			}
			if found {
				return nil, fmt.Errorf("protobuf field %d appears twice", num)
			}
			found = true
			out = protowire.AppendBytes(protowire.AppendTag(out, num, protowire.BytesType), value)
		} else {
			out = append(out, rest[:tagLen+valueLen]...)
		}
		rest = rest[tagLen+valueLen:]
	}
	if !found {
		out = protowire.AppendBytes(protowire.AppendTag(out, num, protowire.BytesType), value)
	}
	return out, nil
}

const mediaTypeYAML = "application/yaml"

func bodyMediaType(contentType string) (string, error) {
	mediaType, _, err := mime.ParseMediaType(contentType)
	if err != nil {
		return "", fmt.Errorf("content type %q: %w", contentType, err)
	}
	return mediaType, nil
}

func isJSONMediaType(mediaType string) bool {
	return mediaType == "application/json" || strings.HasSuffix(mediaType, "+json")
}
