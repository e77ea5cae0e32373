//go:build !deployd_heapprofile

package main

// startHeapProfiles does nothing: the heap profile writer (debugheap.go) is
// built only with -tags deployd_heapprofile.
func startHeapProfiles() {}
