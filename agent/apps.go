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
	"sync/atomic"
	"syscall"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
	"github.com/deployd/deployd/workers/logs"
)

// appRT is one app at run time. Owned by the agent's appSet; the
// supervisor is safe for concurrent use.
type appRT struct {
	name     string
	log      hclog.Logger // the agent's, with the app's name bound
	sup      *workers.Supervisor
	out, err *logs.Sink
	// unstarted: built by a reload and swapped in; the reload's move
	// starts it (begin).
	unstarted atomic.Bool

	// mu guards cfg, lease and stale, and is taken only in the leaf methods
	// below. cfg is the app's running config: only an operation of this app
	// that succeeded sets it.
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

// running returns the lease of the app's running config: its listeners,
// and those it learned from its workers' binds.
func (rt *appRT) running() *handoff.Lease {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	return rt.lease
}

// settle records the outcome of a reload to app (whose spec holds lease):
// done, it is the running config and the previous leases go; abandoned with
// every slot rolled back, lease goes; otherwise (a slot may still run the
// new spec) lease stays until the next operation that settles every worker.
func (rt *appRT) settle(app *config.App, lease *handoff.Lease, err error) {
	var ab *workers.AbandonedError
	switch {
	case err == nil:
		releaseAll(rt.swapConfig(app, lease))
	case errors.As(err, &ab) && ab.RolledBack, errors.Is(err, workers.ErrBusy):
		lease.Release()
	default:
		rt.hold(lease)
	}
}

// swapConfig makes app (whose spec holds lease) the running config and
// returns the leases it no longer needs.
func (rt *appRT) swapConfig(app *config.App, lease *handoff.Lease) []*handoff.Lease {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	old := append(rt.stale, rt.lease)
	rt.cfg, rt.lease, rt.stale = app, lease, nil
	return old
}

// hold keeps lease among the stale ones until the app settles: a spec's
// workers may run on it (a canary's, a reload's that did not roll back).
func (rt *appRT) hold(lease *handoff.Lease) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	rt.stale = append(rt.stale, lease)
}

// unhold takes lease out of the stale ones, for the caller to settle it.
func (rt *appRT) unhold(lease *handoff.Lease) {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	for i, l := range rt.stale {
		if l == lease {
			rt.stale = append(rt.stale[:i], rt.stale[i+1:]...)
			return
		}
	}
}

// takeStale returns and forgets the stale leases.
func (rt *appRT) takeStale() []*handoff.Lease {
	rt.mu.Lock()
	defer rt.mu.Unlock()
	stale := rt.stale
	rt.stale = nil
	return stale
}

// settled releases the stale leases once every worker runs the running
// config again (a restart or deploy that succeeded).
func (rt *appRT) settled() { releaseAll(rt.takeStale()) }

// release gives back every lease, once the app's workers are stopped.
func (rt *appRT) release() {
	rt.settled()
	rt.mu.Lock()
	lease := rt.lease
	rt.mu.Unlock()
	lease.Release()
}

// discard stops the app's workers (if it ever started any), closes its
// logs and gives back its leases: an app removed, or built and not used.
func (rt *appRT) discard() {
	rt.sup.Stop()
	rt.closeLogs()
	rt.release()
}

// begin reports, once, that rt was built by a reload and never started.
func (rt *appRT) begin() bool { return rt.unstarted.CompareAndSwap(true, false) }

func releaseAll(ls []*handoff.Lease) {
	for _, l := range ls {
		l.Release()
	}
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
	rt := a.apps.get(app)
	if rt == nil {
		return nil
	}
	return rt.config()
}

// noSuchApp is the message for an app the agent does not run: apps are
// those it runs, from the config at path.
func noSuchApp(path string, apps []*appRT, name string) string {
	var names []string
	for _, rt := range apps {
		names = append(names, rt.name)
	}
	known := strings.Join(names, ", ")
	if known == "" {
		known = "none"
	}
	return fmt.Sprintf("unknown app %q; apps in %s: %s", name, path, known)
}

// wants are the listeners app's config asks for; checkFolder checks the
// folders of a unix socket path before it is bound (nil: trusting no group,
// handoff.Want).
func wants(app *config.App, checkFolder func(dir string) error) []handoff.Want {
	out := make([]handoff.Want, 0, len(app.Listen))
	balance := app.Balance
	if balance == handoff.BalanceAuto && !app.TrapsBind() {
		balance = handoff.BalanceShared // auto steers once a bind is answered: none is
	}
	for _, l := range app.Listen {
		out = append(out, handoff.Want{URL: l.URL, Network: l.Network, Address: l.Address, Name: l.Name,
			Nonblocking: app.Nonblocking, NoDelay: app.TCPNoDelay, Balance: balance, CheckFolder: checkFolder})
	}
	return out
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
		gid, err := LookupGroup(app.Group)
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

// LookupGroup returns the gid of a group, by name or number.
func LookupGroup(name string) (int, error) {
	if id, err := strconv.Atoi(name); err == nil {
		return id, nil
	}
	g, err := user.LookupGroup(name)
	if err != nil {
		return 0, fmt.Errorf("group %q: %w", name, err)
	}
	return strconv.Atoi(g.Gid)
}

// RunsAsRoot reports whether app's workers and hooks run as uid 0: the
// agent is root and the app has no user, or a user whose uid is 0.
func RunsAsRoot(app *config.App) bool {
	if os.Getuid() != 0 {
		return false
	}
	cred, err := credential(app)
	if err != nil {
		return false // the app cannot start at all
	}
	return cred == nil || cred.Uid == 0
}
