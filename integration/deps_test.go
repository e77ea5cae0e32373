package integration

import (
	"embed"
	"io"
	"os"

	"github.com/deployd/deployd/cli"
	"github.com/deployd/deployd/handoff"
)

// The tests run deployd and the test app as separate binaries that BuildAll
// compiles, and Go's test cache keys a result on the test binary's content:
// without this file a change under cli/, agent/, workers/, handoff/ or
// release/ would leave the binary as it was and `go test` would answer
// "(cached)". linkProduct links everything cmd/deployd runs (cli.Main and
// handoff.RunShim, which reach every product package) into this binary, and
// testAppSources embeds the test app's sources (a main package, which cannot
// be imported), so any change to the code under test reruns the tests.

//go:embed testapp/*.go
var testAppSources embed.FS

// linkProduct is called by TestMain; the condition is never true in a test
// run (the variable is not set by anything), but the linker cannot know it.
func linkProduct() int {
	if os.Getenv("DEPLOYD_IT_LINK_ONLY") != "link-only" {
		entries, _ := testAppSources.ReadDir("testapp")
		return len(entries)
	}
	return cli.Main(os.Args, io.Discard, io.Discard) + handoff.RunShim(nil)
}
