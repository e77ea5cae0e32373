package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
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
	name     string
	sup      *workers.Supervisor
	out, err *logs.Sink
	// busy is held by the operation that replaces workers (reload, deploy,
	// rollback, restart, scale): a second one is refused at once.
	busy sync.Mutex

	// mu guards cfg, lease and stale. cfg is the app's running config: only
	// an operation of this app that succeeded sets it.
	mu    sync.Mutex
	cfg   *config.App
	lease *handoff.Lease // the listeners of cfg
	// stale are the leases of specs whose workers may still run: a reload
	// that neither finished nor rolled back every slot keeps its lease here
	// until an operation moves every worker to cfg again.
	stale []*handoff.Lease
}

// config returns the app's running config.
func (rt *appRT) config() *config.App {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.cfg
}

// bound returns the listeners of the app's running config.
func (rt *appRT) bound() []handoff.Bound {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.lease.Bound()
}

// settle records the outcome of a reload to app (whose spec holds lease):
// done, it is the running config and the previous leases go; abandoned with
// every slot rolled back, lease goes; otherwise (a slot may still run the
// new spec) lease stays until the next operation that settles every worker.
func (rt *appRT) settle(app *config.App, lease *handoff.Lease, err error) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	var ab *workers.AbandonedError
	switch {
	case err == nil:
		old := append(rt.stale, rt.lease)
		rt.cfg, rt.lease, rt.stale = app, lease, nil
		for _, l := range old {
			l.Release()
		}
	case errors.As(err, &ab) && ab.RolledBack, errors.Is(err, workers.ErrBusy):
		lease.Release()
	default:
		rt.stale = append(rt.stale, lease)
	}
}

// settled releases the stale leases once every worker runs the running
// config again (a restart or deploy that succeeded).
func (rt *appRT) settled() {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for _, l := range rt.stale {
		l.Release()
	}
	rt.stale = nil
}

// release gives back every lease, once the app's workers are stopped.
func (rt *appRT) release() {
	rt.settled()
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.lease.Release()
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

// appList returns the apps sorted by name.
func (a *Agent) appList() []*appRT {
	a.mu.Lock()
	defer a.mu.Unlock()
	rts := make([]*appRT, 0, len(a.apps))
	for _, n := range sortedKeys(a.apps) {
		rts = append(rts, a.apps[n])
	}
	return rts
}

// eachApp runs fn for every app in rts in parallel and waits.
func eachApp(rts []*appRT, fn func(rt *appRT)) {
	var wg sync.WaitGroup
	for _, rt := range rts {
		wg.Go(func() { fn(rt) })
	}
	wg.Wait()
}

// AppConfig returns the running config of app, nil for an unknown app.
func (a *Agent) AppConfig(app string) *config.App {
	a.mu.Lock()
	rt := a.apps[app]
	a.mu.Unlock()
	if rt == nil {
		return nil
	}
	return rt.config()
}

// noSuchApp is the message for an app the agent does not run.
func (a *Agent) noSuchApp(name string) string {
	var names []string
	for _, rt := range a.appList() {
		names = append(names, rt.name)
	}
	known := strings.Join(names, ", ")
	if known == "" {
		known = "none"
	}
	return fmt.Sprintf("unknown app %q; apps in %s: %s", name, a.path, known)
}

// wants are the listeners app's config asks for.
func wants(app *config.App) []handoff.Want {
	out := make([]handoff.Want, 0, len(app.Listen))
	for _, l := range app.Listen {
		out = append(out, handoff.Want{URL: l.URL, Network: l.Network, Address: l.Address, Name: l.Name,
			Nonblocking: app.Nonblocking, NoDelay: app.TCPNoDelay, Balance: app.Balance})
	}
	return out
}

// newApp leases the app's listeners, opens its logs and builds its
// supervisor. Nothing runs yet.
func (a *Agent) newApp(app *config.App) (*appRT, error) {
	lease, err := a.reg.Acquire(app.Name, wants(app))
	if err != nil {
		return nil, err
	}
	rt := &appRT{name: app.Name, cfg: app, lease: lease}
	for _, s := range []struct {
		dst  **logs.Sink
		name string
	}{{&rt.out, app.Name + ".out.log"}, {&rt.err, app.Name + ".err.log"}} {
		o := logOptions(app)
		// The agent log says when a file cannot be written (a full log_dir)
		// and when it works again, once per episode.
		o.Path, o.Logger = filepath.Join(a.settings.LogDir, s.name), a.log.Named("logs").With("app", app.Name)
		*s.dst, err = logs.OpenSink(o)
		if err != nil {
			rt.closeLogs()
			lease.Release()
			return nil, fmt.Errorf("log file: %w", err)
		}
	}
	spec, err := a.specFor(app, lease.Bound(), a.state.get(app.Name).Current)
	if err != nil {
		rt.closeLogs()
		lease.Release()
		return nil, err
	}
	rt.sup = workers.New(workers.Options{
		App: app.Name, Shim: a.shim, Out: rt.out, Err: rt.err, Logger: a.log.Named("workers"),
		BeforeStart: a.beforeStart(app.Name), Marker: a.marker, OnReady: a.recordReady,
		Changed:   a.processesChanged,
		NotifyDir: filepath.Join(a.settings.StateDir, "run", "notify"),
	}, spec)
	return rt, nil
}

// specFor builds the workers.Spec of app's config, a new generation; for an
// app that takes releases, of release rel ("" = none yet: no workers).
func (a *Agent) specFor(app *config.App, ls []handoff.Bound, rel string) (*workers.Spec, error) {
	gen := int(a.generation.Add(1))
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
		Env: appEnv(app), Credential: cred, Instances: instances,
		Listeners: ls, Ready: readyPolicy(app.Ready), ReadyTimeout: app.ReadyTimeout, MinReady: app.MinReady,
		StopSignal:  app.StopSignal,
		StopTimeout: app.StopTimeout, Restart: restartPolicy(app.Restart), MaxSurge: app.MaxSurge,
		MaxMemory: app.MaxMemory, Watchdog: app.Watchdog, RecycleAfter: app.RecycleAfter, CPUAffinity: app.CPUAffinity,
		Health: healthPolicy(app.Health),
	}
	if spec.Balance() != handoff.BalanceShared && instances > 0 { // spares need steering (the registry logged a fallback)
		spec.Instances, spec.Spares = instances+app.Spares, app.Spares
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
