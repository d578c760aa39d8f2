package version

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func TestShellCommand(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		wantErr error
		// wantText is expected in the output, or in the error when one is expected.
		wantText string
	}{
		{name: "help", args: []string{"--help"}, wantText: "demo does the thing, at length"},
		{name: "version", args: []string{"--version"}, wantText: "demo version " + Version},
		{name: "run", args: []string{}, wantErr: ErrNotImplemented, wantText: "demo: not implemented yet (tracked by issue 1)"},
		{name: "unknown flag", args: []string{"--no-such-flag"}, wantText: "unknown flag: --no-such-flag"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := NewShellCommand("demo", "does the thing", "demo does the thing, at length", "issue 1")
			var out bytes.Buffer
			cmd.SetOut(&out)
			cmd.SetErr(&out)
			cmd.SetArgs(tt.args)
			err := cmd.Execute()
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("Execute(%v) = %v, want %v", tt.args, err, tt.wantErr)
			}
			got := out.String()
			if err != nil {
				got += err.Error()
			}
			if !strings.Contains(got, tt.wantText) {
				t.Errorf("output %q does not contain %q", got, tt.wantText)
			}
		})
	}
}
