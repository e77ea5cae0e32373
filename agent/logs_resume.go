package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/internal/safeopen"
	"github.com/deployd/deployd/workers/logs"
)

// A follow that the agent ends (it stops, or hands over to a new agent that
// serves the same control socket) tells the client where each log stopped
// (api.LogLine.Resume); the client asks the next agent to go on from there
// (resume=...), so that `deployd logs -f` crosses an agent upgrade with no
// line lost or printed twice.

// sendResume says where each log of a follow the agent ends stopped, for
// the client to go on with the next agent.
func sendResume(ls LogOut, targets []logTarget, ends []*logs.Position) {
	for i, t := range targets {
		if e := ends[i]; e != nil {
			_ = ls.Send(api.LogLine{Resume: &api.LogPos{App: t.app, Dev: e.Dev, Ino: e.Ino, Offset: e.Offset}})
		}
	}
}

// resumeFrom returns the offset in t's current log file to follow from to
// go on at p. If the log was rotated since, it first sends the rest of the
// rotated file (found by its inode; a compressed one is gone: it says so).
func resumeFrom(ls LogOut, t logTarget, p api.LogPos) int64 {
	st, err := os.Lstat(t.path) // a link in the log folder is never followed
	switch {
	case err != nil || p.Ino == 0:
		return 0 // the file appeared since, or is still to come: all of it
	case sameFile(st, p):
		if p.Offset > st.Size() {
			return 0 // emptied since (logs --flush)
		}
		return p.Offset
	}
	if old := rotatedFile(t.path, p); old != "" {
		if err := sendFrom(ls, t.app, old, p.Offset); err == nil || errors.Is(err, ErrClientGone) {
			return 0
		}
	}
	_ = ls.Send(api.LogLine{App: t.app, Error: "the log was rotated and compressed while the follow moved to a new agent: " +
		"lines written just before the rotation may be missing here (they are in the rotated file)"})
	return 0
}

func sameFile(fi os.FileInfo, p api.LogPos) bool {
	st, ok := fi.Sys().(*syscall.Stat_t)
	return ok && uint64(st.Dev) == p.Dev && st.Ino == p.Ino
}

// rotatedFile finds the uncompressed rotated file of the log at path with
// p's inode ("" if there is none).
func rotatedFile(path string, p api.LogPos) string {
	ms, _ := filepath.Glob(strings.TrimSuffix(path, ".log") + "-*.log")
	for _, m := range ms {
		if fi, err := os.Lstat(m); err == nil && fi.Mode().IsRegular() && sameFile(fi, p) {
			return m
		}
	}
	return ""
}

// sendFrom sends every line of the file at path from offset on.
func sendFrom(ls LogOut, app, path string, offset int64) error {
	f, err := safeopen.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return err
	}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), logs.DefaultMaxLine+1)
	for sc.Scan() {
		if err := ls.Send(api.LogLine{App: app, Line: sc.Text()}); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("logs: rotated file %s: %w", path, err)
	}
	return nil
}
