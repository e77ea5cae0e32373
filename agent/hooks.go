package agent

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/workers"
	"github.com/deployd/deployd/workers/logs"
)

const (
	// hookKillGrace is how long a hook that timed out has between SIGTERM
	// and SIGKILL (to every process of its unit).
	hookKillGrace = 5 * time.Second
	// hookTailLines is how many of a hook's last output lines the result keeps.
	hookTailLines = 20
	// hookSlot is the slot of a hook's lines in the app's log.
	hookSlot = -1
)

// hooks runs the apps' before and after hooks (hookexec.go starts and
// stops each one) and keeps the after hooks that run or wait (after,
// afterhook.go). It reaches an app only through the appRT it is handed,
// and the releases' folders through the store it was built with.
type hooks struct {
	log      hclog.Logger
	releases *release.Store
	after    afterHooks
}

// hookRun is one hook to run: which, where, for which operation.
type hookRun struct {
	name     string // "before" or "after"
	argv     []string
	timeout  time.Duration
	dir      string // the release folder
	op       string // "deploy" or "rollback"
	version  string // the release the operation moves to
	previous string // the release serving when it started
}

// plan returns the run of app's hook name, nil when it has none.
func (k *hooks) plan(app *config.App, name, op, version, previous string) *hookRun {
	h := &hookRun{name: name, op: op, version: version, previous: previous,
		dir: k.releases.Path(app.Name, version)}
	switch name {
	case "before":
		h.argv, h.timeout = app.Hooks.Before, app.Hooks.BeforeTimeout
	case "after":
		h.argv, h.timeout = app.Hooks.After, app.Hooks.AfterTimeout
	}
	if h.argv == nil {
		return nil
	}
	h.argv = releaseArgv(h.argv, h.dir)
	return h
}

// run runs h as rt's app user in the release folder, its output
// going to the app's log (slot -1, each line prefixed "hook NAME: ") and
// its last lines to the result. It announces its start and end to emit. An
// after hook counts in k.after (a shutdown or upgrade waits for it), and
// none starts once the agent stops.
func (k *hooks) run(rt *appRT, app *config.App, h *hookRun, emit func(workers.Event)) api.HookResult {
	res := api.HookResult{Hook: h.name, Command: h.argv}
	if h.name == "after" {
		if !k.after.enter() {
			res.ExitStatus, res.Error = "not started", "after hook not run: the agent is stopping"
			rt.log.Error("hook not run: the agent is stopping", "hook", h.name, "version", h.version)
			return res
		}
		defer k.after.leave()
	}
	emit(workers.Event{Time: time.Now(), App: rt.name, Type: workers.EventKind(api.EventHook),
		Release: h.version, Message: h.name + " hook started: " + strings.Join(h.argv, " ")})
	t := time.Now()
	err := execHook(rt, app, h, &res)
	res.DurationSeconds = time.Since(t).Seconds()
	res.OK = err == nil
	if err != nil {
		res.Error = fmt.Sprintf("%s hook %s", h.name, err)
		rt.log.Error("hook failed", "hook", h.name, "version", h.version, "error", err)
	} else {
		rt.log.Info("hook done", "hook", h.name, "version", h.version, "seconds", res.DurationSeconds)
	}
	msg := fmt.Sprintf("%s hook %s after %s", h.name, res.ExitStatus, time.Since(t).Round(time.Millisecond))
	emit(workers.Event{Time: time.Now(), App: rt.name, Type: workers.EventKind(api.EventHook),
		Release: h.version, Millis: time.Since(t).Milliseconds(), Message: msg})
	return res
}

// hookPID is a hook's pid, set once it started (0: it did not): its
// output lines wait for it.
type hookPID struct {
	set chan struct{} // closed once pid is set
	pid int
}

func newHookPID() *hookPID { return &hookPID{set: make(chan struct{})} }

// store sets the pid; once.
func (p *hookPID) store(pid int) {
	p.pid = pid
	close(p.set)
}

func (p *hookPID) get() int {
	<-p.set
	return p.pid
}

// hookLines writes a hook's output, line by line, to an app log sink and a
// tail. exec.Cmd writes each stream from one goroutine (the tail and the
// sink are safe for concurrent use).
type hookLines struct {
	sink        *logs.Sink
	app, stream string
	prefix      string
	tail        *logs.Tail
	pid         *hookPID
	buf         []byte
}

func (w *hookLines) Write(p []byte) (int, error) {
	w.buf = append(w.buf, p...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 && len(w.buf) < logs.DefaultMaxLine {
			break
		}
		if i < 0 {
			i = logs.DefaultMaxLine
			w.line(w.buf[:i])
			w.buf = w.buf[i:]
			continue
		}
		w.line(bytes.TrimSuffix(w.buf[:i], []byte("\r")))
		w.buf = w.buf[i+1:]
	}
	if len(w.buf) == 0 {
		w.buf = nil
	}
	return len(p), nil
}

// flush writes a last line that had no newline. Called after Wait.
func (w *hookLines) flush() {
	if len(w.buf) > 0 {
		w.line(w.buf)
		w.buf = nil
	}
}

func (w *hookLines) line(b []byte) {
	text := w.prefix + string(b)
	w.tail.Add(text)
	if w.sink == nil {
		return
	}
	w.sink.Write(logs.Line{App: w.app, Slot: hookSlot, PID: w.pid.get(), Stream: w.stream, Text: text})
}

// chownRelease gives a new release folder to the app's user, so that its
// before hook (run as that user) can write there. Only root can, and only
// an app with a user or group needs it.
func chownRelease(dir string, app *config.App) error {
	cred, err := credential(app)
	if err != nil || cred == nil || os.Getuid() != 0 {
		return err
	}
	// Through an os.Root, and children before their folder: the app's
	// user, owning a folder already, could swap an entry for a symlink to
	// /etc; the root refuses any path that leaves dir.
	root, err := os.OpenRoot(dir)
	if err != nil {
		return err
	}
	defer root.Close()
	var paths []string
	if err := fs.WalkDir(root.FS(), ".", func(path string, _ fs.DirEntry, err error) error {
		paths = append(paths, path)
		return err
	}); err != nil {
		return err
	}
	for _, p := range slices.Backward(paths) {
		if err := root.Lchown(p, int(cred.Uid), int(cred.Gid)); err != nil {
			return err
		}
	}
	return nil
}

// roll is a move of an app to a release: a deploy or a rollback.
type roll struct {
	op       string // "deploy" or "rollback"
	version  string // the release it moves to
	created  bool   // this deploy created the release's folder: removed again if refused
	strategy workers.Strategy
	canary   int    // > 0: hold a canary of that many workers
	okStatus string // the DeployResult.Status when it went through
}

// rollWithHooks runs rt's before hook in the folder of release r.version,
// rolls rt to it (rollTo), then runs the after hook once it serves (for a
// canary: when it is promoted, deployCanary and queueAfter). A
// before hook that fails refuses the operation: no worker changed, and a
// release folder this deploy created is removed again.
func (a *Agent) rollWithHooks(rt *appRT, r roll, emit func(workers.Event)) *api.DeployResult {
	app, version, op := rt.config(), r.version, r.op
	prev := a.state.get(rt.name).Current
	current := version == prev && len(rt.sup.Status().Workers) > 0
	var hooks []api.HookResult
	if h := a.hooks.plan(app, "before", op, version, prev); h != nil && !current {
		if r.created {
			if err := chownRelease(h.dir, app); err != nil {
				rt.log.Warn("give the release folder to the app's user", "error", err)
			}
		}
		hr := a.hooks.run(rt, app, h, emit)
		hooks = append(hooks, hr)
		if !hr.OK {
			if r.created {
				os.RemoveAll(h.dir)
			}
			serving := "nothing was serving"
			if prev != "" {
				serving = prev + " keeps serving"
			}
			return &api.DeployResult{App: rt.name, Version: version, Previous: prev, Status: api.DeployRefused,
				Error:      fmt.Sprintf("%s refused, nothing changed: %s; %s", op, hr.Error, serving),
				ExitStatus: hr.ExitStatus, LastLines: hr.LastLines, Hooks: hooks}
		}
	}
	res := a.rollTo(rt, r, emit)
	if h := a.hooks.plan(app, "after", op, version, prev); h != nil && res.Status == r.okStatus {
		hooks = append(hooks, a.hooks.run(rt, app, h, emit))
	}
	res.Hooks = hooks
	return res
}
