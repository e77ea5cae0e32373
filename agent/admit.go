package agent

import (
	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/workers"
)

// rule is what an operation asks of its app before it may start.
type rule struct {
	// op names the operation ("deploy", "scale"): what its claim on the
	// app says to a second one.
	op string
	// releases: the app takes releases and is not stopped (deploy, rollback).
	releases bool
	// check is the operation's own refusal, after the app is found and
	// before the lock (nil: none).
	check func(rt *appRT) error
	// endsHold: the operation ends a canary's hold (promote, abort), so a
	// hold does not refuse it.
	endsHold bool
	// lockIfFree: the operation goes on without a claim when another
	// holds the app (a promote or abort of a hold that ended already).
	lockIfFree bool
}

// admit is the one way into an operation on an app: it finds the app,
// applies the rule (releases, the operation's check), refuses the
// operation while the app holds a canary, and claims the app from its
// supervisor (workers.Supervisor.Claim), which owns the app's busy state:
// a second operation is refused at once. Its errors are typed and worded
// for the user (outcome.go maps them). done ends the claim; locked is
// false only for a rule with lockIfFree whose app was claimed already.
func (a *Agent) admit(name string, r rule) (rt *appRT, done func(), locked bool, err error) {
	rt = a.apps.get(name)
	switch {
	case rt == nil:
		return nil, nil, false, failWith(api.KindNotFound, "%s", noSuchApp(a.path, a.apps.list(), name))
	case r.releases && !rt.config().Releases:
		return nil, nil, false, failWith(api.KindUsage,
			"app %s does not take releases; set releases = true in [apps.%s] and reload", name, name)
	}
	if he := rt.sup.Holding(); he != nil && !r.endsHold {
		return nil, nil, false, refused(name, he)
	}
	if r.releases && a.state.get(name).Stopped {
		return nil, nil, false, failWith(api.KindBusy, "%s is stopped (deployd stop); run `deployd start %s` first", name, name)
	}
	if r.check != nil {
		if err := r.check(rt); err != nil {
			return nil, nil, false, err
		}
	}
	done, err = rt.sup.Claim(r.op)
	if err != nil {
		if r.lockIfFree {
			return rt, func() {}, false, nil
		}
		return nil, nil, false, refused(name, workers.ErrBusy)
	}
	return rt, done, true, nil
}
