package agent

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
)

// Startup: the apps of the config get their listeners and logs, then their
// workers (adopted from the previous agent where it handed them over).

// setup opens every app's listeners and the notify socket. Nothing runs yet.
func (a *Agent) setup(cfg *config.Config) error {
	for _, w := range cfg.Warnings {
		a.log.Warn("config: " + w.String())
	}
	for d, what := range map[string]string{cfg.Agent.StateDir: "state (state_dir)", cfg.Agent.LogDir: "app logs (log_dir)"} {
		if _, err := makeDir(a.log, d, what); err != nil {
			return err
		}
	}
	var err error
	if a.state, err = loadState(cfg.Agent.StateDir); err != nil {
		return err
	}
	a.learn = &learner{log: a.log, state: a.state, settings: a.settings,
		apps: func() []*config.App { return appConfigs(a.apps.list()) }}
	a.build = &builder{log: a.log, shim: a.shim, stateDir: cfg.Agent.StateDir, logDir: cfg.Agent.LogDir, reg: a.reg,
		releases: a.releases, state: a.state, book: a.book, learn: a.learn}
	if removed, err := a.releases.RemoveLeftovers(); err != nil { // of deploys cut short
		a.log.Warn("remove staging folders of installs cut short", "error", err)
	} else if len(removed) > 0 {
		a.log.Info("removed staging folders of installs cut short", "folders", removed)
	}
	// Before any app: a handover we cannot read must make this agent give
	// up, so that the previous one keeps its workers.
	if a.inherited, err = a.takeover.receive(); err != nil {
		return fmt.Errorf("read the previous agent's handover: %w", err)
	}
	if a.inherited == nil && len(a.survivors.found) > 0 {
		a.inherited = a.survivors.adopt() // an agent died: adopt what it left
	}
	a.build.inherit(a.inherited)
	handoff.RemoveStaleNotify(filepath.Join(cfg.Agent.StateDir, "run", "notify")) // a killed agent's
	// Apps removed from the config while no agent ran.
	for _, name := range a.state.names() {
		if _, ok := cfg.Apps[name]; !ok {
			if err := a.state.forget(name); err != nil {
				return err
			}
		}
	}
	var rts []*appRT
	for _, name := range cfg.AppNames {
		rt, err := a.build.app(cfg, cfg.Apps[name])
		if err != nil {
			for _, rt := range rts {
				rt.discard()
			}
			return fmt.Errorf("app %s: %w", name, err)
		}
		rts = append(rts, rt)
	}
	a.apps.swap(rts, nil)
	return a.afterSetup() // unused systemd sockets, metrics server
}

// startWatchingSignals runs startApps while still answering SIGTERM, SIGINT
// and `deployd shutdown`: then it stops the workers (which ends the wait for
// readiness at once) and reports stopped. SIGHUP is ignored until ready (a
// handoff needs a ready agent); SIGUSR1 rotates logs as usual.
func (a *Agent) startWatchingSignals(sigs <-chan os.Signal, stop <-chan struct{}) (stopped bool, err error) {
	done := make(chan error, 1)
	go func() { done <- a.startApps() }()
	for {
		select {
		case err := <-done:
			return false, err
		case sig := <-sigs:
			switch sig {
			case syscall.SIGHUP:
				a.log.Warn("SIGHUP ignored: the agent is still starting its workers")
				continue
			case syscall.SIGUSR1:
				rotateAll(a.apps.list())
				continue
			}
			a.log.Info("signal received during startup, stopping", "signal", sig)
		case <-a.shutdown:
			a.log.Info("shutdown requested during startup")
		case <-stop:
		}
		eachApp(a.apps.list(), func(rt *appRT) { stopApp(rt, a.quiet.Load()) })
		<-done
		return true, nil
	}
}

// startApps starts every app's workers in parallel and waits for readiness;
// with a previous agent's handover it takes every app over in the state
// that agent described (adopt.go in workers). The error names the apps
// whose workers were not all ready, except those that were not healthy
// under the previous agent (crash-looping, errored, stopped): whether a
// new agent is ready is its own affair, not one of an app that was failing
// before it started.
func (a *Agent) startApps() error {
	var start []*appRT
	handed := map[string][]*workers.Handover{}
	pools := map[string]*workers.PoolHandover{}
	unhealthy := map[string]bool{}
	if in := a.inherited; in != nil {
		handed, pools, unhealthy, a.inherited = in.byApp, in.pools, in.unhealthy, nil
		a.build.inherit(nil)
	}
	// Apps removed or stopped: their workers go once this agent took over.
	defer func() { a.takeover.orphans = handed }()
	adopt := map[*appRT][]*workers.Handover{}
	for _, rt := range a.apps.list() {
		if a.state.get(rt.name).Stopped {
			rt.log.Info("app stopped by `deployd stop`; not starting it")
			rt.sup.Restore(pools[rt.name])
			continue
		}
		if hs, ok := handed[rt.name]; ok {
			adopt[rt] = hs
			delete(handed, rt.name)
		}
		start = append(start, rt)
	}
	var mu sync.Mutex
	var errs []error
	eachApp(start, func(rt *appRT) {
		t := time.Now()
		start := rt.sup.Start
		if hs, pool := adopt[rt], pools[rt.name]; hs != nil || pool != nil {
			start = func() error { return rt.sup.AdoptPool(pool, hs) }
		}
		err := start()
		switch {
		case err != nil && unhealthy[rt.name]:
			rt.log.Warn("app taken over as it was: not healthy under the previous agent either",
				"state", rt.sup.Status().State, "error", err)
			return
		case err != nil:
			rt.log.Error("app started with errors", "error", err)
			err = fmt.Errorf("app %s: %w", rt.name, err)
			mu.Lock()
			defer mu.Unlock()
			errs = append(errs, err)
			return
		}
		st := rt.sup.Status()
		rt.log.Info("app ready", "workers", rt.sup.Spec().Instances, "state", st.State,
			"restarts", st.Restarts, "in", time.Since(t).Round(time.Millisecond))
	})
	return errors.Join(errs...)
}

// load loads the config and resolves the agent's own binary once: it is
// the workers' shim and what a handoff starts. tableflip starts os.Args[0],
// so that becomes the resolved path (after a swap /proc/self/exe names the
// backup, minio/minio#14778).
func load(opts Options) (*config.Config, string, error) {
	cfg, err := config.Load(opts.ConfigPath)
	if err != nil {
		return nil, "", err
	}
	if opts.Socket != "" {
		cfg.Agent.Socket = opts.Socket
	}
	shim, err := os.Executable()
	if err == nil {
		shim, err = filepath.EvalSymlinks(shim)
	}
	if err != nil {
		return nil, "", fmt.Errorf("find own binary: %w", err)
	}
	os.Args[0] = shim
	return cfg, shim, nil
}
