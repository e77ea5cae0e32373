package agent

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// opApp returns the app named in an operation and holds its busy lock, or
// answers the error itself. The caller must unlock rt.busy.
func (a *Agent) opApp(w http.ResponseWriter, name string) *appRT {
	a.mu.Lock()
	rt := a.apps[name]
	a.mu.Unlock()
	if rt == nil {
		writeError(w, http.StatusNotFound, a.noSuchApp(name))
		return nil
	}
	if refuseHold(w, rt) {
		return nil
	}
	if !rt.busy.TryLock() {
		writeError(w, http.StatusConflict, busyMessage(name))
		return nil
	}
	return rt
}

// finishOp streams the result of an operation on rt.
func finishOp(st *stream, rt *appRT, t time.Time, err error) {
	res := appResult(rt.name, err)
	res.Release, res.DurationSeconds = rt.sup.Spec().Release, time.Since(t).Seconds()
	st.send(api.StreamLine{Result: &api.Result{OK: err == nil, Apps: []api.AppResult{res}}})
}

// parseScale resolves "N", "+N" or "-N" against the current count.
func parseScale(s string, current int) (int, error) {
	s = strings.TrimSpace(s)
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, fmt.Errorf("instances %q: use N, +N or -N, e.g. 4 or +1", s)
	}
	n := v
	if strings.HasPrefix(s, "+") || strings.HasPrefix(s, "-") {
		n = current + v
	}
	if n < 1 {
		return 0, fmt.Errorf("instances %q would leave %d workers; at least 1 (use `deployd stop` to stop the app)", s, n)
	}
	if n > 1024 {
		return 0, fmt.Errorf("instances %q: at most 1024 workers", s)
	}
	return n, nil
}

func (a *Agent) handleScale(w http.ResponseWriter, r *http.Request) {
	var req api.ScaleRequest
	if !decode(w, r, &req) {
		return
	}
	rt := a.opApp(w, req.App)
	if rt == nil {
		return
	}
	defer rt.busy.Unlock()
	reset := req.Instances == api.ScaleReset
	spec := rt.sup.Spec()
	n, err := parseScale(req.Instances, spec.Instances-spec.Spares) // spares come on top
	if reset {
		n, err = rt.config().Instances, nil
	}
	if err != nil {
		writeError(w, http.StatusBadRequest, err.Error())
		return
	}
	if rt.config().Releases && a.state.get(rt.name).Current == "" {
		writeError(w, http.StatusUnprocessableEntity, fmt.Sprintf("%s has no release yet; deploy one first", rt.name))
		return
	}
	st := newStream(w)
	t := time.Now()
	err = rt.sup.Scale(n, st.event)
	if err == nil {
		err = a.state.update(rt.name, func(s *AppState) {
			s.Instances, s.Stopped = n, false
			if reset {
				s.Instances = 0 // the config's count, also after it changes
			}
		})
	}
	if err == nil {
		a.log.Info("app scaled", "app", rt.name, "instances", n)
	}
	finishOp(st, rt, t, err)
}

// runAppOp decodes an AppRequest, holds the app's busy lock, runs op with
// the progress stream, and streams the result.
func (a *Agent) runAppOp(w http.ResponseWriter, r *http.Request, op func(rt *appRT, st *stream) error) {
	var req api.AppRequest
	if !decode(w, r, &req) {
		return
	}
	rt := a.opApp(w, req.App)
	if rt == nil {
		return
	}
	defer rt.busy.Unlock()
	st := newStream(w)
	t := time.Now()
	finishOp(st, rt, t, op(rt, st))
}

func (a *Agent) handleStopApp(w http.ResponseWriter, r *http.Request) {
	a.runAppOp(w, r, func(rt *appRT, _ *stream) error {
		err := rt.sup.Pause()
		if err == nil {
			err = a.state.update(rt.name, func(s *AppState) { s.Stopped = true })
		}
		if err == nil {
			a.log.Info("app stopped", "app", rt.name)
		}
		return err
	})
}

func (a *Agent) handleStartApp(w http.ResponseWriter, r *http.Request) {
	a.runAppOp(w, r, func(rt *appRT, _ *stream) error {
		spec, err := a.specFor(rt.config(), rt.bound(), a.state.get(rt.name).Current)
		if err == nil {
			err = rt.sup.Restart(spec)
		}
		if err == nil {
			rt.settled() // every worker runs the running config's listeners
		}
		if err == nil {
			err = a.state.update(rt.name, func(s *AppState) { s.Stopped = false })
		}
		return err
	})
}
