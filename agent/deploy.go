package agent

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"slices"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/release"
	"github.com/deployd/deployd/workers"
)

func strategyOf(s string) (workers.Strategy, error) {
	switch workers.Strategy(s) {
	case "", workers.Rolling:
		return workers.Rolling, nil
	case workers.BlueGreen:
		return workers.BlueGreen, nil
	}
	return "", fmt.Errorf("unknown strategy %q; use rolling or blue-green", s)
}

// Deploy installs the release req names (a file the caller passed, or a
// path the agent opens for an owner) and rolls the app to it, with its
// before and after hooks; with req.Canary it holds a canary of that many
// workers instead. An error is a refusal before anything changed (worded
// "deploy refused, nothing changed: ..."); otherwise the result says how
// the deploy ended.
func (a *Agent) Deploy(ctx context.Context, req api.DeployRequest, by Caller, emit func(workers.Event)) (*api.DeployResult, error) {
	strategy, err := strategyOf(req.Strategy)
	if err != nil {
		return nil, failWith(api.KindUsage, "%w", err)
	}
	if req.Canary < 0 {
		return nil, failWith(api.KindUsage, "canary %d: give the number of workers to hold on the new release, 1 or more", req.Canary)
	}
	install, err := deployInput(ctx, a.releases, a.settings.StreamTimeout, req, by)
	if err != nil {
		return nil, prefixed("deploy refused, nothing changed: ", err)
	}
	rt, done, _, err := a.admit(req.App, rule{op: "deploy", releases: true})
	if err != nil {
		return nil, err
	}
	defer done()
	if err := canaryFits(a.build, a.state, rt, req.Canary); err != nil { // before the install and the before hook
		return nil, prefixed("deploy refused, nothing changed: ", err)
	}
	t := time.Now()
	rel, err := install()
	if err != nil {
		prefix := "deploy refused, nothing changed: "
		if kindOf(err) == api.KindFailed {
			prefix = "deploy failed, nothing changed: "
		}
		return nil, prefixed(prefix, err)
	}
	if err := checkReleaseCommand(rt, rel); err != nil {
		if rel.Created {
			os.RemoveAll(rel.Path)
		}
		return nil, failWith(api.KindRefused, "deploy refused, nothing changed: %w", err)
	}
	rt.log.Info("release installed", "version", rel.Version, "sha256", rel.SHA256, "kind", rel.Kind)
	res := a.rollWithHooks(rt, roll{op: "deploy", version: rel.Version, created: rel.Created, strategy: strategy,
		canary: req.Canary, okStatus: api.DeployDeployed}, emit)
	res.DurationSeconds = time.Since(t).Seconds()
	return res, nil
}

// deployInput returns the install a deploy request asks for. An attached
// artifact (a file the client opened) is read from its descriptor; a path
// is opened by the agent, so only for root and the agent's uid. The file
// passed is closed when the request ends.
func deployInput(ctx context.Context, releases *release.Store, idle time.Duration, req api.DeployRequest, by Caller) (func() (*release.Release, error), error) {
	if req.Attached {
		f, err := by.file()
		if err != nil {
			return nil, failWith(api.KindUsage, "%w", err)
		}
		// A pipe becomes non-blocking: a client that stops sending meets
		// the idle deadline, and one that hangs up ends the read at once.
		p, err := release.Pollable(f)
		if err != nil {
			f.Close()
			return nil, err
		}
		f = p
		context.AfterFunc(ctx, func() { f.Close() })
		src := release.Source{File: f, Kind: req.Kind, Name: req.Name, Idle: idle}
		return func() (*release.Release, error) {
			return releases.InstallFrom(req.App, src, req.Version, req.SHA256)
		}, nil
	}
	if !by.Owner {
		return nil, failWith(api.KindForbidden, "permission denied: the agent opens an artifact path for root and its own uid only; "+
			"members of socket_group pass the artifact itself: use a deployd CLI of this version or later")
	}
	if !filepath.IsAbs(req.Artifact) {
		return nil, failWith(api.KindUsage, "artifact %q: the agent needs an absolute path", req.Artifact)
	}
	return func() (*release.Release, error) {
		return releases.Install(req.App, req.Artifact, req.Version, req.SHA256)
	}, nil
}

// checkReleaseCommand makes sure the app's command exists in the release,
// and that a release packed with a top-level folder is told so.
func checkReleaseCommand(rt *appRT, rel *release.Release) error {
	if top, file := release.Nested(rel.Path, rt.config().Command); top != "" {
		return fmt.Errorf("release %s has everything under %s/, and the app's command names %s, which is at %s: "+
			"pack the folder's contents (tar -C %s -czf %s.tar.gz .) or set command to name %s",
			rel.Version, top, file, path.Join(top, file), top, top, path.Join(top, file))
	}
	argv := releaseArgv(rt.config().Command, rel.Path)
	if !filepath.IsAbs(argv[0]) {
		return nil // a command looked up in PATH
	}
	fi, err := os.Stat(argv[0])
	if err != nil || !fi.Mode().IsRegular() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("release %s has no executable %s (the app's command); the artifact must contain it",
			rel.Version, rt.config().Command[0])
	}
	return nil
}

// rollTo moves rt to release r.version with a reload and records the
// outcome in the state file; with r.canary it holds a canary instead, and
// the hold's end records it. The caller holds a claim on rt (admit).
func (a *Agent) rollTo(rt *appRT, r roll, emit func(workers.Event)) *api.DeployResult {
	version, prev := r.version, a.state.get(rt.name).Current
	res := &api.DeployResult{App: rt.name, Version: version, Previous: prev, Status: r.okStatus}
	if version == prev && len(rt.sup.Status().Workers) > 0 {
		res.Status = api.DeployUnchanged
		return res
	}
	spec, err := a.build.spec(rt.config(), rt.running(), version)
	switch {
	case err != nil:
	case r.canary > 0:
		if err = a.deployCanary(rt, spec, r, emit, res); err == nil {
			return res
		}
	default:
		err = rt.sup.Reload(spec, r.strategy, emit)
	}
	if err != nil {
		rollFailed(a.state, rt, version, err, res)
		return res
	}
	rollServing(a.state, a.releases, rt, version, prev, res)
	return res
}

// rollFailed records that rt's roll to version failed with err into res
// and the state file (a refusal is not a failed release).
func rollFailed(state *stateFile, rt *appRT, version string, err error, res *api.DeployResult) {
	res.Status, res.Error = api.DeployFailed, err.Error()
	var ab *workers.AbandonedError
	if errors.As(err, &ab) {
		res.ExitStatus, res.LastLines = ab.ExitStatus, ab.LastLines
	}
	switch kindOf(err) {
	case api.KindBusy, api.KindUsage:
		res.Error = appResult(rt.name, err).Error
	default:
		if serr := state.update(rt.name, func(s *AppState) {
			if !slices.Contains(s.Failed, version) {
				s.Failed = append(s.Failed, version)
			}
		}); serr != nil {
			rt.log.Error("record failed release", "error", serr)
		}
	}
	if ab != nil && ab.First {
		rt.log.Error("release not deployed; there was no previous one, and nothing serves", "version", version, "error", err)
		return
	}
	rt.log.Error("release not deployed; the previous one keeps serving", "version", version, "error", err)
}

// rollServing records that rt serves version (after prev) into res and
// the state file, and prunes old releases.
func rollServing(state *stateFile, releases *release.Store, rt *appRT, version, prev string, res *api.DeployResult) {
	rt.settled() // every worker runs the running config's listeners
	if err := state.update(rt.name, func(s *AppState) {
		if s.Current != version {
			s.Previous = s.Current
		}
		s.Current = version
		s.Failed = slices.DeleteFunc(s.Failed, func(v string) bool { return v == version })
	}); err != nil {
		// Serving the new release, but a restart would not know it.
		res.Error = "serving " + version + ", but the state file could not be written: " + err.Error()
		rt.log.Error("write state", "error", err)
	}
	cur := state.get(rt.name)
	if removed, err := releases.Prune(rt.name, rt.config().KeepReleases, cur.Current, cur.Previous); err != nil {
		rt.log.Warn("prune releases", "error", err)
	} else if len(removed) > 0 {
		rt.log.Info("pruned old releases", "versions", removed)
	}
	rt.log.Info("release serving", "version", version, "previous", prev)
}

// Rollback rolls the app back to release req.To (the previous one when
// empty), with its hooks. An error is a refusal before anything changed.
func (a *Agent) Rollback(_ context.Context, req api.RollbackRequest, emit func(workers.Event)) (*api.DeployResult, error) {
	strategy, err := strategyOf(req.Strategy)
	if err != nil {
		return nil, failWith(api.KindUsage, "%w", err)
	}
	rt, done, _, err := a.admit(req.App, rule{op: "rollback", releases: true})
	if err != nil {
		return nil, err
	}
	defer done()
	target, err := rollbackTarget(a.state, a.releases, req)
	if err != nil {
		return nil, err
	}
	t := time.Now()
	res := a.rollWithHooks(rt, roll{op: "rollback", version: target, strategy: strategy, okStatus: api.DeployRolledBack}, emit)
	res.DurationSeconds = time.Since(t).Seconds()
	return res, nil
}

// rollbackTarget is the release a rollback moves to: req.To, or the
// previous one; it must be in releases and not the current one (state).
func rollbackTarget(state *stateFile, releases *release.Store, req api.RollbackRequest) (string, error) {
	cur := state.get(req.App)
	target := req.To
	if target == "" {
		target = cur.Previous
	}
	if target == "" {
		return "", failWith(api.KindRefused, "%s has no previous release to roll back to; see `deployd releases %s`", req.App, req.App)
	}
	if target == cur.Current {
		return "", failWith(api.KindRefused, "%s is the current release of %s already", target, req.App)
	}
	if _, err := releases.Get(req.App, target); err != nil {
		msg := fmt.Sprintf("no release %s of %s on this host", target, req.App)
		if errors.Is(err, release.ErrBadArtifact) { // not a version name: "../x", "/etc"
			msg = err.Error()
		}
		return "", failWith(api.KindRefused, "rollback refused, nothing changed: %s; "+
			"give --to one of the versions `deployd releases %s` lists", msg, req.App)
	}
	return target, nil
}

// Releases lists the releases of app on this host and which serves.
func (a *Agent) Releases(name string) (*api.Releases, error) {
	rt := a.apps.get(name)
	if rt == nil {
		return nil, failWith(api.KindNotFound, "%s", noSuchApp(a.path, a.apps.list(), name))
	}
	if !rt.config().Releases {
		return nil, failWith(api.KindUsage,
			"app %s does not take releases; set releases = true in [apps.%s] and reload", name, name)
	}
	rels, err := a.releases.List(name)
	if err != nil {
		return nil, err
	}
	st := a.state.get(name)
	out := &api.Releases{App: name, Releases: []api.ReleaseInfo{}}
	for _, rel := range rels {
		status := "available"
		switch {
		case rel.Version == st.Current:
			status = "current"
		case rel.Version == st.Previous:
			status = "previous"
		case slices.Contains(st.Failed, rel.Version):
			status = "failed"
		}
		out.Releases = append(out.Releases, api.ReleaseInfo{Version: rel.Version, InstalledAt: rel.InstalledAt,
			SHA256: rel.SHA256, Size: rel.Size, Status: status})
	}
	return out, nil
}

// canaryFits refuses a --canary of n workers that rt could not hold now
// (n = 0: no canary), so that a bad one changes nothing. b builds the
// spec of the release state says serves.
func canaryFits(b *builder, state *stateFile, rt *appRT, n int) error {
	if n == 0 {
		return nil
	}
	spec, err := b.spec(rt.config(), rt.running(), state.get(rt.name).Current)
	if err != nil {
		return nil // rollTo reports it
	}
	return rt.sup.CanaryFits(spec, n)
}
