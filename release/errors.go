package release

import (
	"errors"
	"fmt"
)

// ErrBadArtifact is wrapped by every refusal of an artifact (a
// *RefusedError); nothing was installed.
var ErrBadArtifact = errors.New("release: artifact refused")

// Problem says why an artifact was refused; the CLI words it for a person
// (flags and fixes are the CLI's, not this package's).
type Problem string

// Problems of an artifact.
const (
	NotFound         Problem = "not-found"
	Unreadable       Problem = "unreadable"
	NotRegular       Problem = "not-regular"
	NotExecutable    Problem = "not-executable"
	BadName          Problem = "bad-name"
	BadKind          Problem = "bad-kind"
	BadVersion       Problem = "bad-version"
	VersionExists    Problem = "version-exists"
	ChecksumMismatch Problem = "checksum-mismatch"
	Unpack           Problem = "unpack" // a bad archive: escapes, devices, not a tarball
)

// RefusedError is a refused artifact.
type RefusedError struct {
	Problem Problem
	Detail  string
}

func (e *RefusedError) Error() string        { return e.Detail }
func (e *RefusedError) Is(target error) bool { return target == ErrBadArtifact }

func refuse(p Problem, format string, args ...any) error {
	return &RefusedError{Problem: p, Detail: fmt.Sprintf(format, args...)}
}

// checkVersion refuses a version name that is not a safe folder name.
func checkVersion(version string) error {
	if len(version) > maxVersion || !versionRE.MatchString(version) {
		return refuse(BadVersion, "version %q: use letters, digits, '.', '_', '+' and '-' (at most %d), starting with a letter or digit", version, maxVersion)
	}
	return nil
}
