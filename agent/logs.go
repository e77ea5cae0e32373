package agent

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
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
)

// logTarget is one log file a logs call reads or acts on.
type logTarget struct {
	app     string
	sink    *logs.Sink
	path    string
	stream  string
	journal bool // the app logs to the systemd journal only, not to path ("both" is read from path)
}

// logTargets returns the sinks of app (every app of rts when ""), sorted
// by app: stdout's and stderr's, or only the one of stream ("out" or
// "err"), or the refusal of an unknown app (of the config at cfgPath).
// The files are in logDir.
func logTargets(rts []*appRT, logDir, cfgPath, app, stream string) ([]logTarget, error) {
	var out []logTarget
	for _, rt := range rts {
		name := rt.name
		if app != "" && name != app {
			continue
		}
		j := rt.cfg != nil && rt.cfg.Logs.Target == logs.TargetJournal
		if stream != "err" {
			out = append(out, logTarget{name, rt.out, filepath.Join(logDir, name+".out.log"), "out", j})
		}
		if stream != "out" {
			out = append(out, logTarget{name, rt.err, filepath.Join(logDir, name+".err.log"), "err", j})
		}
	}
	if app != "" && out == nil {
		return nil, failWith(api.KindNotFound, "%s", noSuchApp(cfgPath, rts, app))
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
// Send is safe for concurrent use, and returns ErrClientGone once the
// client is gone (it stopped taking them: then the call's ctx is done
// too); Flush asks to pass on what was sent.
type LogOut interface {
	Send(api.LogLine) error
	Flush()
}

// ErrClientGone is LogOut.Send's error once the client is gone.
var ErrClientGone = errors.New("the client is gone")

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
	targets, err := logTargets(a.apps.list(), a.settings.LogDir, a.path, req.App, stream)
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
	targets, journals := splitJournal(targets)
	starts := firstLines(out, targets, req.Lines, resume, req.Follow)
	switch {
	case ctx.Err() != nil: // the client is gone
		closeStarts(starts)
		return nil
	case !req.Follow:
		journalLines(fctx, out, journals, req.Lines, false)
		_ = out.Send(api.LogLine{Done: true})
		return nil
	}
	out.Flush()
	var wg sync.WaitGroup
	wg.Go(func() { journalLines(fctx, out, journals, req.Lines, true) })
	ends := followAll(fctx, out, targets, starts)
	wg.Wait()
	if ctx.Err() == nil {
		sendResume(out, targets, ends) // the agent ended it: stops, or hands over
	}
	return nil
}

// splitJournal separates the targets of apps that log to the journal.
func splitJournal(ts []logTarget) (files, journals []logTarget) {
	for _, t := range ts {
		if t.journal {
			journals = append(journals, t)
		} else {
			files = append(files, t)
		}
	}
	return files, journals
}

// journalLines sends the last n lines of each target from the journal
// (journalctl), and with follow the later ones until ctx is done; the
// follows run at once. A follow of the journal is not resumed by the
// next agent: the client asks again.
func journalLines(ctx context.Context, ls LogOut, ts []logTarget, n int, follow bool) {
	var wg sync.WaitGroup
	for _, t := range ts {
		read := func() {
			err := logs.JournalLines(ctx, t.app, t.stream, n, follow, func(line string) error {
				return ls.Send(api.LogLine{App: t.app, Line: line})
			})
			if err != nil && !errors.Is(err, ErrClientGone) {
				_ = ls.Send(api.LogLine{App: t.app, Error: err.Error()})
			}
		}
		if !follow {
			read()
			continue
		}
		wg.Go(read)
	}
	wg.Wait()
}

// followStart is where a follow of one log starts: where the last lines
// sent end (tailed), or an offset in the current file (-1: not followed).
type followStart struct {
	tailed *logs.Tailed
	from   int64
}

// firstLines sends the last n lines of each target's log, read from the
// files as the client takes them (logs.StreamLast), or nothing for a
// target resumed, and returns where to follow each from (nil without
// follow). It stops, returning nil, when the client is gone.
func firstLines(ls LogOut, targets []logTarget, n int, resume map[string]api.LogPos, follow bool) []followStart {
	starts := make([]followStart, len(targets))
	for i, t := range targets {
		if p, ok := resume[t.app]; ok {
			starts[i].from = resumeFrom(ls, t, p)
			continue
		}
		tailed, err := logs.StreamLast(t.path, n, func(line string) error {
			return ls.Send(api.LogLine{App: t.app, Line: line})
		})
		switch {
		case errors.Is(err, ErrClientGone):
			closeStarts(starts)
			return nil
		case errors.Is(err, fs.ErrNotExist):
			// no file yet: Follow waits for it and reads it whole
		case err != nil:
			_ = ls.Send(api.LogLine{App: t.app, Error: err.Error()})
			starts[i].from = -1
		case follow:
			starts[i].tailed = tailed
		default:
			tailed.Close()
		}
	}
	if !follow {
		return nil
	}
	return starts
}

// closeStarts lets go of the files the starts hold.
func closeStarts(starts []followStart) {
	for _, s := range starts {
		s.tailed.Close()
	}
}

// followAll streams the lines appended to each target's log from starts[i]
// (skipping those at -1) until ctx is done, and returns where each
// stopped (nil for one skipped or failed).
func followAll(ctx context.Context, ls LogOut, targets []logTarget, starts []followStart) []*logs.Position {
	ends := make([]*logs.Position, len(targets))
	var wg sync.WaitGroup
	for i, t := range targets {
		if starts[i].tailed == nil && starts[i].from < 0 {
			continue
		}
		wg.Go(func() {
			// A client gone (Send fails) ends ctx, and so the follow.
			send := func(line string) { _ = ls.Send(api.LogLine{App: t.app, Line: line}) }
			var end logs.Position
			var err error
			if tl := starts[i].tailed; tl != nil {
				end, err = tl.Follow(ctx, t.path, send)
			} else {
				end, err = logs.FollowFrom(ctx, t.path, starts[i].from, send)
			}
			if err != nil {
				_ = ls.Send(api.LogLine{App: t.app, Error: err.Error()})
				return
			}
			ends[i] = &end
		})
	}
	wg.Wait()
	return ends
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
	targets, err := logTargets(a.apps.list(), a.settings.LogDir, a.path, app, "")
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
	return logs.Options{Format: app.Logs.Format, Target: app.Logs.Target, MaxSize: app.Logs.MaxSize, MaxFiles: app.Logs.MaxFiles,
		MaxAge: app.Logs.MaxAge, Compress: app.Logs.Compress}
}

// applyLogSettings gives rt's log files app's [apps.NAME.logs] settings
// when a reload from old changed them (they were kept until the next
// agent start, while the reload said done).
func applyLogSettings(rt *appRT, old, app *config.App, emit func(workers.Event)) {
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
	rt.log.Info("log settings applied", "target", app.Logs.Target, "format", app.Logs.Format, "max_size", app.Logs.MaxSize,
		"max_files", app.Logs.MaxFiles, "max_age", app.Logs.MaxAge, "compress", app.Logs.Compress)
	emit(workers.Event{Time: time.Now(), App: app.Name, Type: workers.EventKind(api.EventNotice), Message: "new [logs] settings applied"})
}
