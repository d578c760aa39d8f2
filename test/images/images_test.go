package images

import (
	"archive/tar"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// TestWriteOCI writes an image and reads it back as containerd's import
// does: the index names it by the annotation, the config runs the
// entrypoint, the layer holds the file with its directory.
func TestWriteOCI(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "hello")
	if err := os.WriteFile(bin, []byte("#!binary"), 0o755); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "image.tar")
	img := Image{Name: "ctrlmesh.test/hello:1", Files: map[string]string{"/usr/bin/hello": bin}, Entrypoint: []string{"/usr/bin/hello"}, User: "65532"}
	if err := WriteOCI(file, dir, img); err != nil {
		t.Fatal(err)
	}

	// The tarball holds the layout at its root.
	untarred := filepath.Join(dir, "untarred")
	untar(t, file, untarred)
	p, err := layout.FromPath(untarred)
	if err != nil {
		t.Fatal(err)
	}
	index, err := p.ImageIndex()
	if err != nil {
		t.Fatal(err)
	}
	manifest, err := index.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(manifest.Manifests) != 1 || manifest.Manifests[0].Annotations[AnnotationImageName] != img.Name {
		t.Fatalf("index manifests: %+v, want one annotated %s=%s", manifest.Manifests, AnnotationImageName, img.Name)
	}
	image, err := index.Image(manifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	config, err := image.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if config.OS != "linux" || len(config.Config.Entrypoint) != 1 || config.Config.Entrypoint[0] != "/usr/bin/hello" || config.Config.User != "65532" {
		t.Fatalf("config: os %q, entrypoint %q, user %q", config.OS, config.Config.Entrypoint, config.Config.User)
	}
	layers, err := image.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("layers: %d, %v", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer rc.Close()
	var names []string
	r := tar.NewReader(rc)
	for {
		h, err := r.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		names = append(names, h.Name)
		if h.Name == "usr/bin/hello" && h.Mode&0o111 == 0 {
			t.Errorf("usr/bin/hello has mode %o, want executable", h.Mode)
		}
	}
	want := []string{"usr/", "usr/bin/", "usr/bin/hello"}
	if len(names) != len(want) || names[0] != want[0] || names[1] != want[1] || names[2] != want[2] {
		t.Fatalf("layer holds %q, want %q", names, want)
	}
}

func untar(t *testing.T, file, dir string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	r := tar.NewReader(f)
	for {
		h, err := r.Next()
		if err == io.EOF {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		target := filepath.Join(dir, h.Name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(target, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(r)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(target, data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBuildAsShipped: the Dockerfile that builds the images and the
// Makefile that builds bin/ (what the local fleet and its benchmarks run)
// build the four commands as BuildStatic does, so that the sidecar tests
// and benchmarks measure is the one that ships.
func TestBuildAsShipped(t *testing.T) {
	want := append(append(append([]string{}, shippedEnv...), shippedFlags...), shippedLDFlags)
	for file, line := range map[string]string{
		// The RUN that builds /out/app.
		"../../deploy/docker/Dockerfile": "go build",
		// SHIPPED_BUILD, which the build target runs for the commands.
		"../../Makefile": "SHIPPED_BUILD :=",
	} {
		data, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		// Continued lines are one line.
		text := strings.ReplaceAll(string(data), "\\\n", " ")
		var build string
		for _, l := range strings.Split(text, "\n") {
			if strings.Contains(l, line) {
				build = l
				break
			}
		}
		if build == "" {
			t.Errorf("%s: no line with %q", file, line)
			continue
		}
		for _, w := range want {
			if !strings.Contains(build, w) {
				t.Errorf("%s builds without %q, as the images of tests are built (test/images): %s", file, w, strings.Join(strings.Fields(build), " "))
			}
		}
	}
	makefile, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(makefile), "$(SHIPPED_BUILD) -o $(BIN)/ $(addprefix ./cmd/,$(COMMANDS))") {
		t.Error("the Makefile's build target does not build the commands with SHIPPED_BUILD")
	}
}
