// Command deployd is the zero-downtime deploy agent and its CLI.
package main

import (
	"os"

	"github.com/deployd/deployd/cli"
	"github.com/deployd/deployd/handoff"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == handoff.ShimArg {
		os.Exit(handoff.RunShim(os.Args[2:]))
	}
	startHeapProfiles()
	os.Exit(cli.Main(os.Args, os.Stdout, os.Stderr))
}
