package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/workers"
)

type peerKey struct{}

// withPeerCred stores the client's credentials (SO_PEERCRED) in the
// connection's context.
func withPeerCred(ctx context.Context, c net.Conn) context.Context {
	uc, ok := c.(*net.UnixConn)
	if !ok {
		return ctx
	}
	raw, err := uc.SyscallConn()
	if err != nil {
		return ctx
	}
	var cred *unix.Ucred
	_ = raw.Control(func(fd uintptr) {
		cred, _ = unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
	})
	if cred == nil {
		return ctx
	}
	return context.WithValue(ctx, peerKey{}, cred)
}

// allowed: root, the agent's own uid, or (with socket_group) that group.
func (a *Agent) allowed(r *http.Request) (bool, string) {
	cred, _ := r.Context().Value(peerKey{}).(*unix.Ucred)
	if cred == nil {
		return false, "permission denied: the agent could not read the client's credentials"
	}
	if cred.Uid == 0 || int(cred.Uid) == os.Getuid() {
		return true, ""
	}
	if g := a.settings.SocketGroup; g != "" {
		if gid, err := lookupGroup(g); err == nil && int(cred.Gid) == gid {
			return true, ""
		}
	}
	return false, fmt.Sprintf("permission denied: uid %d may not control this agent; run as root or as uid %d",
		cred.Uid, os.Getuid())
}

func (a *Agent) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+api.PathStatus, a.handleStatus)
	mux.HandleFunc("GET "+api.PathVersion, a.handleVersion)
	mux.HandleFunc("POST "+api.PathShutdown, a.handleShutdown)
	mux.HandleFunc("POST "+api.PathReload, a.handleReload)
	mux.HandleFunc("POST "+api.PathRestart, a.handleRestart)
	mux.HandleFunc("GET "+api.PathLogs, a.handleLogs)
	mux.HandleFunc("POST "+api.PathLogsRotate, a.handleLogsRotate)
	mux.HandleFunc("POST "+api.PathLogsFlush, a.handleLogsFlush)
	mux.HandleFunc("POST "+api.PathUpgrade, a.handleUpgrade)
	mux.HandleFunc("POST "+api.PathDeploy, a.handleDeploy)
	mux.HandleFunc("POST "+api.PathRollback, a.handleRollback)
	mux.HandleFunc("GET "+api.PathReleases, a.handleReleases)
	mux.HandleFunc("POST "+api.PathScale, a.handleScale)
	mux.HandleFunc("POST "+api.PathStop, a.handleStopApp)
	mux.HandleFunc("POST "+api.PathStart, a.handleStartApp)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if ok, why := a.allowed(r); !ok {
			a.log.Warn("control request refused", "reason", why)
			writeError(w, http.StatusForbidden, why)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, api.MaxRequestBytes)
		mux.ServeHTTP(w, r)
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func writeError(w http.ResponseWriter, code int, msg string) {
	writeJSON(w, code, api.Error{Error: msg})
}

// decode reads a JSON body into v; it answers 400 itself on failure.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return true // an empty body is an empty request
	}
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request too large: the limit is %d bytes", mbe.Limit))
			return false
		}
		writeError(w, http.StatusBadRequest, "bad request: the body is not valid JSON for this call: "+err.Error())
		return false
	}
	return true
}

func (a *Agent) handleVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.VersionInfo{Version: version.String(), PID: os.Getpid()})
}

func (a *Agent) handleShutdown(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, struct{}{})
	a.requestShutdown()
}

func (a *Agent) handleStatus(w http.ResponseWriter, r *http.Request) {
	name := r.URL.Query().Get("app")
	st := api.Status{Agent: api.Agent{
		Version: version.String(), PID: os.Getpid(), UptimeSeconds: time.Since(a.started).Seconds(),
		Config: a.path, Socket: a.socket, RSSBytes: selfRSS(),
	}, Apps: []api.App{}}
	for _, rt := range a.appList() {
		if name == "" || rt.name == name {
			st.Apps = append(st.Apps, appStatus(rt))
		}
	}
	if name != "" && len(st.Apps) == 0 {
		writeError(w, http.StatusNotFound, a.noSuchApp(name))
		return
	}
	writeJSON(w, http.StatusOK, st)
}

func appStatus(rt *appRT) api.App {
	s := rt.sup.Status()
	state := string(s.State)
	if rt.config().Releases && s.Release == "" && len(s.Workers) == 0 {
		state = "no release"
	}
	app := api.App{Name: rt.name, State: state, Release: s.Release, Instances: s.Instances,
		Restarts: s.Restarts, LastExit: s.LastExit, LastLines: s.LastLines, Workers: []api.Worker{},
		DroppedLogLines: droppedLogLines(rt)}
	for _, l := range rt.config().Listen {
		app.Listen = append(app.Listen, l.URL)
	}
	for _, w := range s.Workers {
		app.Workers = append(app.Workers, api.Worker{
			Slot: w.Slot, PID: w.PID, State: string(w.State), Release: w.Release, Generation: w.Generation,
			Restarts: w.Restarts, UptimeSeconds: w.Uptime.Seconds(),
			MemoryReplacements: w.MemoryReplacements, WatchdogReplacements: w.WatchdogReplacements, ReadyMillis: w.ReadyAfter.Milliseconds(),
			CPUPercent: w.CPUPercent, RSSBytes: w.RSSBytes, Status: w.Status,
		})
	}
	return app
}

// stream writes StreamLines to an HTTP answer; safe for concurrent use.
type stream struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
}

func newStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	return &stream{w: w, rc: http.NewResponseController(w)}
}

func (s *stream) send(l api.StreamLine) {
	s.mu.Lock()
	defer s.mu.Unlock()
	// A client that went away does not stop the operation.
	_ = json.NewEncoder(s.w).Encode(l)
	_ = s.rc.Flush()
}

func (s *stream) event(e workers.Event) {
	ae := api.Event(e)
	s.send(api.StreamLine{Event: &ae})
}

func (a *Agent) handleRestart(w http.ResponseWriter, r *http.Request) {
	var req api.AppRequest
	if !decode(w, r, &req) {
		return
	}
	a.mu.Lock()
	rt := a.apps[req.App]
	a.mu.Unlock()
	if rt == nil {
		writeError(w, http.StatusNotFound, a.noSuchApp(req.App))
		return
	}
	if !rt.busy.TryLock() {
		writeError(w, http.StatusConflict, busyMessage(req.App))
		return
	}
	defer rt.busy.Unlock()
	st := newStream(w)
	t := time.Now()
	res := api.AppResult{App: req.App, Outcome: api.OutcomeDone, Release: rt.sup.Spec().Release}
	err := rt.sup.Restart(nil)
	if err == nil {
		err = a.state.update(req.App, func(s *AppState) { s.Stopped = false })
	}
	if err != nil {
		res.Outcome, res.Error = api.OutcomeFailed, err.Error()
		if errors.Is(err, workers.ErrBusy) {
			res.Outcome, res.Error = api.OutcomeRefused, busyMessage(req.App)
		}
	}
	res.DurationSeconds = time.Since(t).Seconds()
	st.send(api.StreamLine{Result: &api.Result{OK: res.Outcome == api.OutcomeDone, Apps: []api.AppResult{res}}})
}

func busyMessage(app string) string {
	return fmt.Sprintf("%s: another reload, restart or deploy of this app is running; wait for it to finish, then try again", app)
}
