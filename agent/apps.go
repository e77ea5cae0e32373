package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
	"github.com/deployd/deployd/workers/logs"
)

// appRT is one app at run time. Owned by Agent (under a.mu); the supervisor
// is safe for concurrent use.
type appRT struct {
	name      string
	cfg       *config.App
	sup       *workers.Supervisor
	listeners []*handoff.Listener
	out, err  *logs.Sink
	// busy is held by the operation that replaces workers (reload, deploy,
	// rollback, restart, scale): a second one is refused at once.
	busy sync.Mutex

	mu sync.Mutex // guards cfg and listeners, which a reload replaces
}

// config returns the app's current config.
func (rt *appRT) config() *config.App {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.cfg
}

// lis returns the app's current listeners.
func (rt *appRT) lis() []*handoff.Listener {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.listeners
}

func (rt *appRT) set(app *config.App, ls []*handoff.Listener) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.cfg, rt.listeners = app, ls
}

func (rt *appRT) closeLogs() {
	for _, s := range []*logs.Sink{rt.out, rt.err} {
		if s != nil {
			s.Close()
		}
	}
}

func (rt *appRT) rotateLogs() error {
	for _, s := range []*logs.Sink{rt.out, rt.err} {
		if s != nil {
			if err := s.Rotate(); err != nil {
				return err
			}
		}
	}
	return nil
}

// newApp acquires the app's listeners, opens its logs and builds its
// supervisor. Called with a.mu held or before the agent serves.
func (a *Agent) newApp(app *config.App) (*appRT, error) {
	ls, err := a.acquireListeners(app)
	if err != nil {
		return nil, err
	}
	rt := &appRT{name: app.Name, cfg: app, listeners: ls}
	logDir := a.cfg.Agent.LogDir
	for _, s := range []struct {
		dst  **logs.Sink
		name string
	}{{&rt.out, app.Name + ".out.log"}, {&rt.err, app.Name + ".err.log"}} {
		*s.dst, err = logs.OpenSink(logs.Options{
			Path: filepath.Join(logDir, s.name), Format: app.Logs.Format, MaxSize: app.Logs.MaxSize,
			MaxFiles: app.Logs.MaxFiles, MaxAge: app.Logs.MaxAge, Compress: app.Logs.Compress,
		})
		if err != nil {
			rt.closeLogs()
			return nil, fmt.Errorf("log file: %w", err)
		}
	}
	a.generation++
	spec, err := a.specFor(app, ls, a.generation, a.state.get(app.Name).Current)
	if err != nil {
		rt.closeLogs()
		return nil, err
	}
	rt.sup = workers.New(workers.Options{
		App: app.Name, Shim: a.shim, Out: rt.out, Err: rt.err, Logger: a.log.Named("workers"),
	}, spec)
	return rt, nil
}

// pin marks ls as in use by an operation in flight (so that another app's
// reload does not close them); unpin undoes it. Called with a.mu held.
func (a *Agent) pin(ls []*handoff.Listener, delta int) {
	if a.pending == nil {
		a.pending = map[string]int{}
	}
	for _, l := range ls {
		a.pending[l.Key()] += delta
	}
}

// acquireListeners returns the listeners of app, reusing the agent's open
// ones. A new one that cannot be opened fails the whole call; listeners it
// opened are kept in a.listeners (a later call reuses them).
func (a *Agent) acquireListeners(app *config.App) ([]*handoff.Listener, error) {
	out := make([]*handoff.Listener, 0, len(app.Listen))
	for _, l := range app.Listen {
		key := handoff.Key(l.Network, l.Address)
		hl := a.listeners[key]
		if hl == nil { // socket activation: systemd's socket for this URL, if it passed one
			var err error
			if hl, err = a.adoptActivated(app, l); err != nil {
				return nil, fmt.Errorf("listen %s: %w", l.URL, err)
			}
		}
		if hl == nil {
			var err error
			hl, err = handoff.Acquire(a.upg.Fds, l.Network, l.Address, l.Name, app.Nonblocking)
			if err != nil {
				return nil, fmt.Errorf("listen %s: %w", l.URL, err)
			}
			if hl.Inherited {
				a.log.Info("listener inherited", "app", app.Name, "listen", l.URL)
			}
			a.listeners[key] = hl
		}
		hl.Name = l.Name
		out = append(out, hl)
	}
	return out, nil
}

// closeUnusedListeners closes listeners no app uses any more, nor a reload
// in flight (a.pending). Called with a.mu held.
func (a *Agent) closeUnusedListeners() {
	used := map[string]bool{}
	for _, rt := range a.apps {
		for _, l := range rt.lis() {
			used[l.Key()] = true
		}
	}
	for key, n := range a.pending {
		if n > 0 {
			used[key] = true
		}
	}
	for key, l := range a.listeners {
		if !used[key] {
			a.log.Info("closing listener no app uses", "address", l.Address)
			// shutdown(2) acts on the socket itself, so the copy tableflip
			// keeps for a handoff stops listening too.
			l.Shutdown()
			l.Close()
			if l.Network == "unix" {
				_ = os.Remove(l.Address)
			}
			delete(a.listeners, key)
		}
	}
}

// specFor builds the workers.Spec of app's config; for an app that takes
// releases, of release rel ("" = none yet: no workers).
func (a *Agent) specFor(app *config.App, ls []*handoff.Listener, gen int, rel string) (*workers.Spec, error) {
	cred, err := credential(app)
	if err != nil {
		return nil, err
	}
	release, argv, dir := configRelease(app), app.Command, app.Cwd
	instances := app.Instances
	if n := a.state.get(app.Name).Instances; n > 0 {
		instances = n
	}
	if app.Releases {
		release, dir = rel, a.releases.Path(app.Name, rel)
		argv = releaseArgv(app.Command, dir)
		if rel == "" {
			instances, dir = 0, app.Cwd
		}
	}
	spec := &workers.Spec{
		Release: release, Generation: gen, Argv: argv, Dir: dir,
		Env: append(workerBaseEnv(), app.Env...), Credential: cred, Instances: instances,
		Listeners: ls, Ready: app.Ready, ReadyTimeout: app.ReadyTimeout, StopSignal: app.StopSignal,
		StopTimeout: app.StopTimeout, Restart: app.Restart, MaxSurge: app.MaxSurge,
		MaxMemory: app.MaxMemory, Watchdog: app.Watchdog, CPUAffinity: app.CPUAffinity,
	}
	if spec.Node, err = a.nodeSpec(app, argv, ls); err != nil {
		return nil, err
	}
	return spec, nil
}

// releaseArgv resolves a relative command inside the release folder dir.
func releaseArgv(cmd []string, dir string) []string {
	argv := append([]string(nil), cmd...)
	switch {
	case filepath.IsAbs(argv[0]):
	case strings.Contains(argv[0], "/"):
		argv[0] = filepath.Join(dir, argv[0])
	default:
		if fi, err := os.Stat(filepath.Join(dir, argv[0])); err == nil && fi.Mode().IsRegular() {
			argv[0] = filepath.Join(dir, argv[0])
		}
	}
	return argv
}

// configRelease names an app's configured version: a short hash of what the
// workers run, so a reload that changes the command or env shows a new one.
func configRelease(app *config.App) string {
	h := sha256.New()
	fmt.Fprintf(h, "%q %q %q", app.Command, app.Cwd, app.Env)
	if fi, err := os.Stat(app.Command[0]); err == nil {
		fmt.Fprintf(h, " %d %d", fi.Size(), fi.ModTime().UnixNano())
	}
	return "cfg-" + hex.EncodeToString(h.Sum(nil))[:8]
}

// workerBaseEnv is the agent's environment without what belongs to the
// agent alone (systemd's and deployd's own variables).
func workerBaseEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		switch {
		case strings.HasPrefix(k, "LISTEN_"), k == "NOTIFY_SOCKET", k == "WATCHDOG_USEC", k == "WATCHDOG_PID",
			strings.HasPrefix(k, "DEPLOYD_"), strings.HasPrefix(k, "TABLEFLIP_"), k == "NODE_CHANNEL_FD":
			continue
		}
		env = append(env, kv)
	}
	return env
}

// credential returns the uid/gid (and the user's groups) to run app's
// workers as, nil for the agent's own. Names or numeric ids both work.
func credential(app *config.App) (*syscall.Credential, error) {
	if app.User == "" && app.Group == "" {
		return nil, nil
	}
	cred := &syscall.Credential{Uid: uint32(os.Getuid()), Gid: uint32(os.Getgid()), NoSetGroups: true}
	if app.User != "" {
		u, err := lookupUser(app.User)
		if err != nil {
			return nil, err
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		cred.Uid, cred.Gid = uint32(uid), uint32(gid)
		// Only the user's own groups, never the agent's.
		cred.NoSetGroups = false
		if ids, err := u.GroupIds(); err == nil {
			for _, id := range ids {
				if g, err := strconv.Atoi(id); err == nil {
					cred.Groups = append(cred.Groups, uint32(g))
				}
			}
		}
	}
	if app.Group != "" {
		gid, err := lookupGroup(app.Group)
		if err != nil {
			return nil, err
		}
		cred.Gid = uint32(gid)
	}
	if os.Getuid() != 0 && (cred.Uid != uint32(os.Getuid()) || cred.Gid != uint32(os.Getgid())) {
		return nil, fmt.Errorf("user %q group %q: the agent must run as root to start workers as another user or group", app.User, app.Group)
	}
	if os.Getuid() != 0 {
		cred.NoSetGroups = true
	}
	return cred, nil
}

func lookupUser(name string) (*user.User, error) {
	if _, err := strconv.Atoi(name); err == nil {
		if u, err := user.LookupId(name); err == nil {
			return u, nil
		}
	}
	u, err := user.Lookup(name)
	if err != nil {
		return nil, fmt.Errorf("user %q: %w", name, err)
	}
	return u, nil
}

func lookupGroup(name string) (int, error) {
	if id, err := strconv.Atoi(name); err == nil {
		return id, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", name, err)
	}
	return strconv.Atoi(g.Gid)
}
