package safeopen

import "testing"

// withWalk runs the rest of t with the O_NOFOLLOW walk, as on a kernel
// without openat2.
func withWalk(t *testing.T) {
	old := noOpenat2.Load()
	noOpenat2.Store(true)
	t.Cleanup(func() { noOpenat2.Store(old) })
}
