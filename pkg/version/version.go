// Package version holds the build version, set with -ldflags -X.
package version

// Version is the pulse version; `make build` sets it from git describe.
var Version = "dev"
