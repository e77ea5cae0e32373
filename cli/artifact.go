package cli

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	"github.com/deployd/deployd/agent/api"
)

// artifact is what deploy passes to the agent: a file opened with the
// caller's own permissions (the agent, maybe root, never opens the path),
// or for a folder the read end of a pipe that a goroutine fills with
// api.PackDir's tar stream.
type artifact struct {
	f      *os.File
	packed chan error // the packing goroutine's result (folders only)
	err    error
	done   bool
}

// openArtifact opens path for a deploy and fills req's Kind and Name.
func openArtifact(path string, req *api.DeployRequest) (*artifact, error) {
	fi, err := os.Stat(path)
	if err != nil {
		return nil, fail(ExitUsage, "--artifact: %v", err)
	}
	abs, _ := filepath.Abs(path)
	req.Kind, req.Name = api.ArtifactKind(path, fi), filepath.Base(abs)
	if req.Kind != api.ArtifactDir {
		f, err := os.Open(path)
		if err != nil {
			return nil, fail(ExitUsage, "--artifact: %v (deployd reads the artifact as you, the user running the CLI)", err)
		}
		return &artifact{f: f}, nil
	}
	if err := api.CheckReadable(path); err != nil {
		return nil, fail(ExitUsage, "--artifact: %v (deployd reads the artifact as you, the user running the CLI)", err)
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		return nil, fail(ExitFailed, "--artifact: %v", err)
	}
	a := &artifact{f: pr, packed: make(chan error, 1)}
	go func() {
		err := api.PackDir(pw, path)
		pw.Close()
		a.packed <- err
	}()
	return a, nil
}

// close closes the file and, for a folder, waits for the packing and
// returns its error (an agent that stopped reading is not one). Safe to
// call twice.
func (a *artifact) close() error {
	if a == nil || a.done {
		return a.errOrNil()
	}
	a.done = true
	a.f.Close()
	if a.packed != nil {
		if err := <-a.packed; err != nil && !errors.Is(err, syscall.EPIPE) {
			a.err = err
		}
	}
	return a.err
}

func (a *artifact) errOrNil() error {
	if a == nil {
		return nil
	}
	return a.err
}

// deployHints add the fix, in the CLI's words, to an agent's refusal.
var deployHints = map[string]string{
	"checksum-mismatch": "check --sha256, or leave it out",
	"version-exists":    "pick another --version, or remove the folder if deployd did not install it",
	"not-executable":    "chmod +x the file, or ship a folder or a .tar.gz",
	"bad-version":       "pass another --version",
}

// upgradeHints add the fix, in the CLI's words, to a refused upgrade.
var upgradeHints = map[string]string{
	"checksum-mismatch":  "check --sha256",
	"checksum-format":    "--sha256 takes the 64 hex digits sha256sum prints",
	"signature-required": "pass --signature FILE, the minisign signature of --binary",
	"bad-signature":      "sign --binary with the key whose public half is upgrade_public_key",
	"no-public-key":      "set [agent] upgrade_public_key, or upgrade as root or the agent's user",
	"not-executable":     "chmod +x the --binary file",
}

// withHint appends hints[reason] to a refusal.
func withHint(err error, hints map[string]string) error {
	var se *api.StatusError
	if errors.As(err, &se) {
		if h := hints[se.Reason]; h != "" {
			return &api.StatusError{Code: se.Code, Kind: se.Kind, Reason: se.Reason, Message: fmt.Sprintf("%s (%s)", se.Message, h)}
		}
	}
	return err
}

func deployHint(err error) error { return withHint(err, deployHints) }
