// Package images makes container images for the real nodes of tests
// without Docker or a registry: static Go binaries in one layer, written as
// an OCI image layout tarball that containerd imports (ctr images import)
// under the name of its io.containerd.image.name annotation. Images are
// built into a work directory at test time, never kept in the repository.
package images

import (
	"archive/tar"
	"bytes"
	"context"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// AnnotationImageName is the annotation of an OCI index's manifest that
// names the image containerd's import creates.
const AnnotationImageName = "io.containerd.image.name"

// Image is an image of files, run by its entrypoint.
type Image struct {
	// Name is the full reference, such as "ctrlmesh.test/pause:1"; pods
	// name it with imagePullPolicy Never or IfNotPresent.
	Name string
	// Files maps a path in the image to the file on this machine to copy
	// there (mode 0755: binaries).
	Files map[string]string
	// Entrypoint is the command the image runs.
	Entrypoint []string
	// User the entrypoint runs as, numeric ("65532"), as the images of
	// deploy/docker set it; empty: root. A container with runAsNonRoot
	// (the injected proxy's) needs a numeric non-root user here, or the
	// kubelet refuses to start it.
	User string
}

// The build of a shipped binary, as deploy/docker/Dockerfile runs it for
// the images and the Makefile's build for bin/: static (no cgo), paths
// trimmed, no symbol table or DWARF. What tests and benchmarks measure of
// a ctrlmesh binary (its memory: the executable's pages are most of the
// sidecar's) is then what ships. TestBuildAsShipped holds the Dockerfile
// and the Makefile to these.
var (
	shippedEnv     = []string{"CGO_ENABLED=0"}
	shippedFlags   = []string{"-trimpath"}
	shippedLDFlags = "-s -w"
)

// BuildStatic builds the main package pkg (as go build names it, relative
// to dir, such as "./test/images/pause") into a static Linux binary at out,
// which any image can hold, built as the shipped binaries are.
func BuildStatic(ctx context.Context, dir, pkg, out string) error {
	return BuildStaticVersion(ctx, dir, pkg, out, "")
}

// BuildStaticVersion is BuildStatic with ctrlmesh's version
// (pkg/version.Version) set to version, as the Makefile's builds set it;
// empty leaves "dev". Two builds of one package that differ in version
// make two images, such as the old and the new of a rolling update.
func BuildStaticVersion(ctx context.Context, dir, pkg, out, version string) error {
	ldflags := shippedLDFlags
	if version != "" {
		ldflags += " -X github.com/ctrlmesh/ctrlmesh/pkg/version.Version=" + version
	}
	args := append(append([]string{"build"}, shippedFlags...), "-ldflags="+ldflags, "-o", out, pkg)
	cmd := exec.CommandContext(ctx, "go", args...)
	cmd.Dir = dir
	cmd.Env = append(append(os.Environ(), shippedEnv...), "GOOS=linux")
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("images: building %s: %w: %s", pkg, err, output)
	}
	return nil
}

// WriteOCI writes img as an OCI image layout tarball at file, with dir as
// scratch space (its layout is left there).
func WriteOCI(file, dir string, img Image) error {
	if img.Name == "" || len(img.Entrypoint) == 0 {
		return fmt.Errorf("images: an image needs a name and an entrypoint")
	}
	layerTar, err := tarFiles(img.Files)
	if err != nil {
		return fmt.Errorf("images: %s: %w", img.Name, err)
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return fmt.Errorf("images: the layer of %s: %w", img.Name, err)
	}
	base := mutate.ConfigMediaType(mutate.MediaType(empty.Image, types.OCIManifestSchema1), types.OCIConfigJSON)
	image, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return fmt.Errorf("images: %s: %w", img.Name, err)
	}
	config, err := image.ConfigFile()
	if err != nil {
		return fmt.Errorf("images: the config of %s: %w", img.Name, err)
	}
	config = config.DeepCopy()
	config.OS, config.Architecture = "linux", runtime.GOARCH
	config.Config.Entrypoint = img.Entrypoint
	config.Config.User = img.User
	if image, err = mutate.ConfigFile(image, config); err != nil {
		return fmt.Errorf("images: the config of %s: %w", img.Name, err)
	}

	layoutDir := filepath.Join(dir, "oci-layout")
	if err := os.RemoveAll(layoutDir); err != nil {
		return fmt.Errorf("images: %w", err)
	}
	p, err := layout.Write(layoutDir, empty.Index)
	if err != nil {
		return fmt.Errorf("images: writing the layout of %s: %w", img.Name, err)
	}
	if err := p.AppendImage(image, layout.WithAnnotations(map[string]string{AnnotationImageName: img.Name})); err != nil {
		return fmt.Errorf("images: writing %s: %w", img.Name, err)
	}
	return tarDir(file, layoutDir)
}

// Import imports the OCI tarball file into the containerd at address, in
// the k8s.io namespace where its CRI plugin (so the kubelet) finds images.
func Import(ctx context.Context, address, file string) error {
	cmd := exec.CommandContext(ctx, "ctr", "--address", address, "--namespace", "k8s.io", "images", "import", file)
	if output, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("images: importing %s (ctr images import): %w: %s", file, err, output)
	}
	return nil
}

// tarFiles is a layer tar of files (path in the image to file here), with
// their directories.
func tarFiles(files map[string]string) ([]byte, error) {
	var buf bytes.Buffer
	w := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, name := range slices.Sorted(maps.Keys(files)) {
		clean := strings.TrimPrefix(path.Clean("/"+name), "/")
		// The directories, outermost first.
		var parents []string
		for d := path.Dir(clean); d != "." && !dirs[d]; d = path.Dir(d) {
			dirs[d] = true
			parents = append(parents, d)
		}
		for _, d := range slices.Backward(parents) {
			if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755}); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(files[name])
		if err != nil {
			return nil, err
		}
		if err := w.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: clean, Mode: 0o755, Size: int64(len(data))}); err != nil {
			return nil, err
		}
		if _, err := w.Write(data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// tarDir writes the files under dir into the tar file.
func tarDir(file, dir string) (err error) {
	f, err := os.Create(file)
	if err != nil {
		return fmt.Errorf("images: %w", err)
	}
	defer func() {
		if closeErr := f.Close(); err == nil && closeErr != nil {
			err = fmt.Errorf("images: %w", closeErr)
		}
	}()
	w := tar.NewWriter(f)
	if err := w.AddFS(os.DirFS(dir)); err != nil {
		return fmt.Errorf("images: writing %s: %w", file, err)
	}
	if err := w.Close(); err != nil {
		return fmt.Errorf("images: writing %s: %w", file, err)
	}
	return nil
}
