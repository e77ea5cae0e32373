package agent

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/addrpolicy"
	"github.com/deployd/deployd/workers"
)

// discoverListens fills in the listener of every app of names that has no
// listen list and runs node: the address its first listen(port) asks for,
// which the agent then binds and passes to every worker like a configured
// one, when the address policy allows it (accepted). fresh: run the app
// to find out (a reload: the code may have changed); otherwise the address
// the last run found, kept in state.json, is used when there is one (an
// agent starting, taking over from an upgrade or a crash, whose workers
// already serve it), checked again against the config. It changes cfg
// and state.json only for an accepted address: a refusal changes nothing.
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
		addr, err := a.accepted(cfg, name, raw)
		if err != nil {
			return err
		}
		l, err := config.DiscoveredListen(addr.String(), name)
		if err != nil {
			return fmt.Errorf("app %s listens on %s, which deployd cannot serve: %w; add a listen list to [apps.%s]", name, raw, err, name)
		}
		app.Listen = []config.Listen{l}
		if err := a.state.update(name, func(st *AppState) { st.Listen = addr.String() }); err != nil {
			return err
		}
		a.log.Info("listen discovered from the app's own listen call", "app", name, "listen", addr.String())
	}
	return nil
}

// accepted puts the address app name's code asked for (raw, as its
// report said it) to the address policy, with every other address of cfg
// and the one the app serves now; a refusal is logged and returned.
func (a *Agent) accepted(cfg *config.Config, name, raw string) (addrpolicy.Addr, error) {
	network, address, _ := strings.Cut(raw, "://")
	req := addrpolicy.Request{
		App:    name,
		Asked:  addrpolicy.Addr{Network: network, Address: address},
		Others: a.otherAddrs(cfg, name),
		Ports:  cfg.Apps[name].AllowPorts,
	}
	if held, err := addrpolicy.Parse(a.state.get(name).Listen); err == nil {
		req.Held = []addrpolicy.Addr{held}
	}
	addr, err := addrpolicy.Decide(req)
	var refused *addrpolicy.RefusedError
	if errors.As(err, &refused) {
		a.log.Error("refused the address an app's code asked for", "app", name, "asked", raw,
			"reason", string(refused.Reason), "by", refused.By)
	}
	return addr, err
}

// otherAddrs are the addresses of cfg that are not app name's: other
// apps' listen lists, the addresses other apps without one serve now
// (state.json), the agent's control socket and metrics.
func (a *Agent) otherAddrs(cfg *config.Config, name string) []addrpolicy.Use {
	var out []addrpolicy.Use
	for _, n := range cfg.AppNames {
		if n == name {
			continue
		}
		owner := "app " + n
		for _, l := range cfg.Apps[n].Listen {
			out = append(out, addrpolicy.Use{Owner: owner, Addr: l.Addr()})
		}
		if len(cfg.Apps[n].Listen) == 0 {
			if l, err := addrpolicy.Parse(a.state.get(n).Listen); err == nil {
				out = append(out, addrpolicy.Use{Owner: owner + " (learned from its code)", Addr: l})
			}
		}
	}
	if cfg.Agent.Metrics != "" {
		out = append(out, addrpolicy.Use{Owner: "[agent] metrics", Addr: addrpolicy.Addr{Network: "tcp", Address: cfg.Agent.Metrics}})
	}
	if cfg.Agent.Socket != "" {
		out = append(out, addrpolicy.Use{Owner: "[agent] socket", Addr: addrpolicy.Addr{Network: "unix", Address: cfg.Agent.Socket}})
	}
	return out
}

// discover runs app once without listeners (workers.Discover) and returns
// the address it asked for.
func (a *Agent) discover(app *config.App) (string, error) {
	spec, err := a.specFor(app, nil, "")
	if err != nil {
		return "", err
	}
	sup := workers.New(workers.Options{
		App: app.Name, Shim: a.shim, Logger: a.log.Named("workers"), Marker: a.book.marker,
		NotifyDir: filepath.Join(a.settings.StateDir, "run", "notify"),
	}, spec)
	defer sup.Stop()
	return sup.Discover(spec)
}
