// Package goinstall holds the test that `go install
// github.com/deployd/deployd/cmd/deployd@VERSION` works for a published
// module: it publishes the work tree as a module version on a file-system
// module proxy and installs from there, as a Go user would.
package goinstall
