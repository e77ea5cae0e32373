package agent

import (
	"fmt"
	"path/filepath"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/workers"
)

// discoverListens fills in the listener of every app of names that has no
// listen list and runs node: the address its first listen(port) asks for,
// which the agent then binds and passes to every worker like a configured
// one. fresh: run the app to find out (a reload: the code may have
// changed); otherwise the address the last run found, kept in state.json,
// is used when there is one (an agent starting, taking over from an
// upgrade or a crash, whose workers already serve it). It changes cfg only.
func (a *Agent) discoverListens(cfg *config.Config, names []string, fresh bool) error {
	for _, name := range names {
		app := cfg.Apps[name]
		if app == nil || !app.DiscoversListen() {
			continue
		}
		raw := a.state.get(name).Listen
		if fresh || raw == "" {
			var err error
			if raw, err = a.discover(app); err != nil {
				return fmt.Errorf("app %s: %w", name, err)
			}
		}
		l, err := config.DiscoveredListen(raw, name)
		if err != nil {
			return fmt.Errorf("app %s listens on %s, which deployd cannot serve: %w; add a listen list to [apps.%s]", name, raw, err, name)
		}
		app.Listen = []config.Listen{l}
		if err := a.state.update(name, func(st *AppState) { st.Listen = raw }); err != nil {
			return err
		}
		a.log.Info("listen discovered from the app's own listen call", "app", name, "listen", raw)
	}
	return nil
}

// discover runs app once without listeners (workers.Discover) and returns
// the address it asked for.
func (a *Agent) discover(app *config.App) (string, error) {
	spec, err := a.specFor(app, nil, "")
	if err != nil {
		return "", err
	}
	sup := workers.New(workers.Options{
		App: app.Name, Shim: a.shim, Logger: a.log.Named("workers"), Marker: a.marker,
		NotifyDir: filepath.Join(a.settings.StateDir, "run", "notify"),
	}, spec)
	defer sup.Stop()
	return sup.Discover(spec)
}
