// Package golden compares a checked-in file with what the code renders, and
// rewrites it on request, for files such as deploy/rbac/*.yaml that must
// never drift from the code that generates them.
package golden

import (
	"bytes"
	"os"
	"testing"
)

// Check fails t unless the file at path holds want. With update set it first
// writes want there. what names the rendering and regenerate the command
// that rewrites the file, for the failure message.
func Check(t testing.TB, path string, want []byte, update bool, what, regenerate string) {
	t.Helper()
	if update {
		if err := os.WriteFile(path, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from %s; run '%s'\n--- file\n%s\n--- rendered\n%s", path, what, regenerate, got, want)
	}
}
