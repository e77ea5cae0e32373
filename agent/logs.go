package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers"
	"github.com/deployd/deployd/workers/logs"
)

const (
	// logsFlushTimeout bounds how long a log call waits for the sinks to
	// write what they hold, so that lines printed just before show up.
	logsFlushTimeout = 5 * time.Second
	// maxJoinSearch bounds the bytes tailFrom reads to find where the last
	// lines it returned end in a file that grew meanwhile.
	maxJoinSearch = 8 << 20
	// joinContext is how many of its last lines tailFrom looks for.
	joinContext = 8
)

// logTarget is one log file a logs call reads or acts on.
type logTarget struct {
	app  string
	sink *logs.Sink
	path string
}

// logTargets returns the sinks of app (every app when ""), sorted by app:
// stdout's and stderr's, or only the one of stream ("out" or "err"), or
// the refusal of an unknown app.
func (a *Agent) logTargets(app, stream string) ([]logTarget, error) {
	var out []logTarget
	for _, rt := range a.appList() {
		name := rt.name
		if app != "" && name != app {
			continue
		}
		if stream != "err" {
			out = append(out, logTarget{name, rt.out, filepath.Join(a.settings.LogDir, name+".out.log")})
		}
		if stream != "out" {
			out = append(out, logTarget{name, rt.err, filepath.Join(a.settings.LogDir, name+".err.log")})
		}
	}
	if app != "" && out == nil {
		return nil, failWith(api.KindNotFound, "%s", a.noSuchApp(app))
	}
	return out, nil
}

// droppedLogLines is how many lines of rt's workers the agent could not log.
func droppedLogLines(rt *appRT) uint64 {
	var n uint64
	for _, s := range []*logs.Sink{rt.out, rt.err} {
		if s != nil {
			n += s.Dropped()
		}
	}
	return n
}

// flushSinks waits (briefly) until every target's sink has written what it
// holds. A closed sink (its app was just removed) has nothing to write.
func flushSinks(ctx context.Context, ts []logTarget) {
	ctx, cancel := context.WithTimeout(ctx, logsFlushTimeout)
	defer cancel()
	for _, t := range ts {
		if t.sink != nil {
			_ = t.sink.Flush(ctx)
		}
	}
}

// LogOut receives the lines of a logs call (the control API streams them):
// Send is safe for concurrent use; Flush asks to pass on what was sent.
type LogOut interface {
	Send(api.LogLine)
	Flush()
}

// Logs sends the last req.Lines lines of each log req asks for (or, for an
// app in req.Resume, what followed where a follow stopped), then, with
// req.Follow, every new line until ctx is done (the client went away) or
// stop is (the agent stops or hands over): then it sends where each log
// stopped, for the client to resume with the next agent. An error (an
// unknown app) comes before any line.
func (a *Agent) Logs(ctx, stop context.Context, req api.LogsRequest, out LogOut) error {
	stream := "out"
	if req.Err {
		stream = "err"
	}
	targets, err := a.logTargets(req.App, stream)
	if err != nil {
		return err
	}
	resume := map[string]api.LogPos{}
	for _, p := range req.Resume {
		resume[p.App] = p
	}
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if req.Follow {
		// A stopping agent (SIGTERM, `deployd shutdown`, a handoff) ends
		// the follow, which would otherwise hold the stop up to its bound.
		defer context.AfterFunc(stop, cancel)()
	}
	flushSinks(fctx, targets)
	froms := firstLines(out, targets, req.Lines, resume)
	if !req.Follow {
		out.Send(api.LogLine{Done: true})
		return nil
	}
	out.Flush()
	ends := followAll(fctx, out, targets, froms)
	if ctx.Err() == nil {
		sendResume(out, targets, ends) // the agent ended it: stops, or hands over
	}
	return nil
}

// firstLines sends the last n lines of each target's log, or nothing for a
// target resumed, and returns the offsets to follow from (-1: unreadable).
func firstLines(ls LogOut, targets []logTarget, n int, resume map[string]api.LogPos) []int64 {
	froms := make([]int64, len(targets))
	for i, t := range targets {
		if p, ok := resume[t.app]; ok {
			froms[i] = resumeFrom(ls, t, p)
			continue
		}
		lines, from, err := tailFrom(t.path, n)
		if err != nil {
			ls.Send(api.LogLine{App: t.app, Error: err.Error()})
			froms[i] = -1
			continue
		}
		for _, l := range lines {
			ls.Send(api.LogLine{App: t.app, Line: l})
		}
		froms[i] = from
	}
	return froms
}

// followAll streams the lines appended to each target's log from froms[i]
// (skipping negative ones) until ctx is done, and returns where each
// stopped (nil for one skipped or failed).
func followAll(ctx context.Context, ls LogOut, targets []logTarget, froms []int64) []*logs.Position {
	ends := make([]*logs.Position, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		if froms[i] < 0 {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			end, err := logs.FollowFrom(ctx, t.path, froms[i], func(line string) {
				ls.Send(api.LogLine{App: t.app, Line: line})
			})
			if err != nil {
				ls.Send(api.LogLine{App: t.app, Error: err.Error()})
				return
			}
			ends[i] = &end
		}()
	}
	wg.Wait()
	return ends
}

// tailFrom returns the last n lines of the log at path and the offset in the
// current file where they end, for Follow to go on from there without a gap
// or a line twice. Workers may write meanwhile: if the file grew while
// LastLines read it, the offset is found by looking for the last line in
// what was added; if it was rotated, it tries again.
func tailFrom(path string, n int) ([]string, int64, error) {
	var lines []string
	for range 3 {
		before, errB := os.Stat(path)
		var err error
		lines, err = logs.LastLines(path, n)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, 0, err
		}
		after, errA := os.Stat(path)
		switch {
		case errors.Is(errB, fs.ErrNotExist) && errors.Is(errA, fs.ErrNotExist):
			return lines, 0, nil // Follow waits for the file and reads it whole
		case errB != nil || errA != nil:
			continue
		case !os.SameFile(before, after):
			continue // rotated meanwhile
		case len(lines) == 0:
			return lines, after.Size(), nil
		case before.Size() == after.Size():
			// A write may be in progress all the same, the file ending
			// mid-line: Follow will deliver that line whole.
			if size := after.Size(); size > 0 && !endsLine(path, size) {
				last := lines[len(lines)-1]
				return lines[:len(lines)-1], max(size-int64(len(last)), 0), nil
			}
			return lines, after.Size(), nil
		}
		off, partial := joinOffset(path, lines[max(len(lines)-joinContext, 0):], before.Size(), after.Size())
		if partial {
			lines = lines[:len(lines)-1] // Follow delivers it whole
		}
		return lines, off, nil
	}
	// Rotated three times while reading: follow the newest file from its start.
	return lines, 0, nil
}

// endsLine reports whether the byte before offset size of path is a newline
// (or cannot be read: then there is nothing better to do).
func endsLine(path string, size int64) bool {
	f, err := os.Open(path)
	if err != nil {
		return true
	}
	defer f.Close()
	b := []byte{0}
	if _, err := f.ReadAt(b, size-1); err != nil {
		return true
	}
	return b[0] == '\n'
}

// joinOffset finds where LastLines stopped reading the file at path, which
// grew from lo to hi bytes meanwhile. tail is the end of what it returned,
// a few lines whose last one may be partial (it read a write in progress).
// It looks for the first place at line start where tail's lines are and the
// last one ends at or after lo; when the last one is whole, the result is
// after its newline, else (partial) its start, so that Follow delivers it
// whole. When it cannot tell, it returns lo: a line may then show twice,
// but none is missed.
func joinOffset(path string, tail []string, lo, hi int64) (off int64, partial bool) {
	want := []byte(strings.Join(tail, "\n"))
	lastLen := len(tail[len(tail)-1])
	// From the byte before the earliest start of a tail that ends at lo.
	start := max(lo-int64(len(want))-2, 0)
	if hi-start > maxJoinSearch {
		return lo, false
	}
	f, err := os.Open(path)
	if err != nil {
		return lo, false
	}
	defer f.Close()
	b := make([]byte, hi-start)
	if _, err := f.ReadAt(b, start); err != nil {
		return lo, false
	}
	for i := 0; i < len(b); {
		j := bytes.Index(b[i:], want)
		if j < 0 {
			break
		}
		at := i + j // want starts at start+at
		end := at + len(want)
		whole := end < len(b) && b[end] == '\n'
		switch {
		case start+int64(at) != 0 && (at == 0 || b[at-1] != '\n'):
			// not at the start of a line
		case whole && start+int64(end)+1 >= lo:
			return start + int64(end) + 1, false
		case !whole && start+int64(end) >= lo:
			return start + int64(end-lastLen), true
		}
		i = at + 1
	}
	return lo, false
}

// RotateLogFiles rotates the log files of app (every app's when "") now.
func (a *Agent) RotateLogFiles(app string) (*api.LogFilesResult, error) {
	return a.logFiles(app, "rotated", (*logs.Sink).Rotate)
}

// EmptyLogFiles empties the log files of app (every app's when "").
func (a *Agent) EmptyLogFiles(app string) (*api.LogFilesResult, error) {
	return a.logFiles(app, "emptied", (*logs.Sink).Truncate)
}

// logFiles applies op to the log files of app.
func (a *Agent) logFiles(app, verb string, op func(*logs.Sink) error) (*api.LogFilesResult, error) {
	targets, err := a.logTargets(app, "")
	if err != nil {
		return nil, err
	}
	res := &api.LogFilesResult{Files: []string{}}
	for _, t := range targets {
		err := op(t.sink)
		switch {
		case errors.Is(err, logs.ErrClosed):
			// The app was removed meanwhile; its log is no longer written.
		case err != nil:
			a.log.Error("log file not "+verb, "app", t.app, "path", t.path, "error", err)
			res.Errors = append(res.Errors, fmt.Sprintf("%s: %v", t.app, err))
		default:
			res.Files = append(res.Files, t.path)
		}
	}
	a.log.Info("log files "+verb, "app", app, "files", len(res.Files), "errors", len(res.Errors))
	return res, nil
}

// logOptions are the settings of app's log files.
func logOptions(app *config.App) logs.Options {
	return logs.Options{Format: app.Logs.Format, MaxSize: app.Logs.MaxSize, MaxFiles: app.Logs.MaxFiles,
		MaxAge: app.Logs.MaxAge, Compress: app.Logs.Compress}
}

// applyLogSettings gives rt's log files app's [apps.NAME.logs] settings
// when a reload from old changed them (they were kept until the next
// agent start, while the reload said done).
func (a *Agent) applyLogSettings(rt *appRT, old, app *config.App, emit func(workers.Event)) {
	if old == nil || old.Logs == app.Logs || rt.out == nil || rt.err == nil {
		return
	}
	for _, s := range []*logs.Sink{rt.out, rt.err} {
		if err := s.Reconfigure(logOptions(app)); err != nil {
			rt.log.Error("apply the new log settings; the previous ones stay", "error", err)
			emit(workers.Event{Time: time.Now(), App: app.Name, Type: workers.EventKind(api.EventNotice),
				Message: "the new [logs] settings could not be applied: " + err.Error()})
			return
		}
	}
	rt.log.Info("log settings applied", "format", app.Logs.Format, "max_size", app.Logs.MaxSize,
		"max_files", app.Logs.MaxFiles, "max_age", app.Logs.MaxAge, "compress", app.Logs.Compress)
	emit(workers.Event{Time: time.Now(), App: app.Name, Type: workers.EventKind(api.EventNotice), Message: "new [logs] settings applied"})
}
