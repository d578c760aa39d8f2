package version

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
)

// ErrNotImplemented is what a command returns while its behaviour is still to
// be built: it fails loudly instead of pretending to work.
var ErrNotImplemented = errors.New("not implemented yet")

// NewShellCommand builds the root command of a binary whose behaviour a later
// change fills in. It documents the binary in --help, reports --version, and
// refuses to run.
func NewShellCommand(name, short, long, issue string) *cobra.Command {
	return &cobra.Command{
		Use:           name,
		Short:         short,
		Long:          long,
		Version:       Version,
		SilenceUsage:  true,
		SilenceErrors: false,
		Args:          cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			return fmt.Errorf("%s: %w (tracked by %s)", name, ErrNotImplemented, issue)
		},
	}
}
