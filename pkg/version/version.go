// Package version holds the ctrlmesh version, set at build time with
// -ldflags "-X github.com/ctrlmesh/ctrlmesh/pkg/version.Version=…".
package version

// Version of the binary; "dev" for builds without the Makefile's ldflags.
var Version = "dev"
