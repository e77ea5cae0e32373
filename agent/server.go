package agent

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/workers"
)

// handlers of the calls in Privileges, by "METHOD PATH".
func (a *Agent) handlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET " + api.PathStatus:      a.handleStatus,
		"GET " + api.PathVersion:     a.handleVersion,
		"POST " + api.PathShutdown:   a.handleShutdown,
		"POST " + api.PathReload:     a.handleReload,
		"POST " + api.PathRestart:    a.handleRestart,
		"GET " + api.PathLogs:        a.handleLogs,
		"POST " + api.PathLogsRotate: a.handleLogsRotate,
		"POST " + api.PathLogsFlush:  a.handleLogsFlush,
		"POST " + api.PathUpgrade:    a.handleUpgrade,
		"POST " + api.PathDeploy:     a.handleDeploy,
		"POST " + api.PathRollback:   a.handleRollback,
		"GET " + api.PathReleases:    a.handleReleases,
		"POST " + api.PathScale:      a.handleScale,
		"POST " + api.PathStop:       a.handleStopApp,
		"POST " + api.PathStart:      a.handleStartApp,
		"POST " + api.PathPromote:    a.handlePromote,
		"POST " + api.PathAbort:      a.handleAbort,
	}
}

// routes serves every call of the Privileges table, each behind its check.
// Every request is logged with its caller and what it asked.
func (a *Agent) routes() http.Handler {
	mux := http.NewServeMux()
	hs := a.handlers()
	for _, p := range Privileges {
		mux.HandleFunc(p.Method+" "+p.Path, hs[p.Method+" "+p.Path])
	}
	log := a.log.Named("control")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		peer := peerOf(r.Context())
		// The body is bounded in size and in time: a client that trickles
		// it keeps its connection no longer than controlBodyTimeout.
		rc := http.NewResponseController(w)
		_ = rc.SetReadDeadline(time.Now().Add(controlBodyTimeout))
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, api.MaxRequestBytes))
		_ = rc.SetReadDeadline(time.Time{}) // net/http's background read must not time out under a long operation
		kv := []any{"call", r.Method + " " + r.URL.RequestURI(), "request", summarize(body)}
		var who []any // how the operation's log lines name the caller
		if peer != nil {
			kv = append(kv, "uid", peer.UID, "gid", peer.GID, "pid", peer.PID, "role", peer.Role.String())
			who = []any{"uid", peer.UID, "client_pid", peer.PID}
		}
		if err != nil {
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				err = failWith(api.KindTooLarge, "request too large: the limit is %d bytes", mbe.Limit)
			}
			log.Warn("control request refused", append(kv, "reason", err.Error())...)
			writeErr(w, "", err)
			return
		}
		ok, why := a.authorize(peer, r.Method, r.URL.Path)
		if ok {
			ok, why = a.authorizeApp(peer, r.Method, r.URL.Path, body)
		}
		if !ok {
			log.Warn("control request refused", append(kv, "reason", why)...)
			writeError(w, http.StatusForbidden, why)
			return
		}
		log.Info("control request", kv...)
		r.Body = io.NopCloser(bytes.NewReader(body))
		ow := newOpWriter(w, r, log, who)
		mux.ServeHTTP(ow, r)
		ow.finish()
	})
}

// summarize is a request body for the log: at most 300 bytes.
func summarize(body []byte) string {
	const max = 300
	b := bytes.TrimSpace(body)
	if len(b) > max {
		return string(b[:max]) + "..."
	}
	return string(b)
}

// controlListener makes every connection of the control socket keep the
// file descriptors clients pass (api.FileConn).
func controlListener(l net.Listener) net.Listener {
	if ul, ok := l.(*net.UnixListener); ok {
		return api.FileListener{UnixListener: ul}
	}
	return l
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// decode reads a JSON body into v; it answers 400 itself on failure.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if errors.Is(err, io.EOF) {
		return true // an empty body is an empty request
	}
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request too large: the limit is %d bytes", mbe.Limit))
		return false
	}
	if err == nil {
		if _, terr := dec.Token(); !errors.Is(terr, io.EOF) {
			err = errors.New("data after the JSON value")
		}
	}
	if err != nil {
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
			app := appStatus(rt)
			app.Scaled = a.state.get(rt.name).Instances
			st.Apps = append(st.Apps, app)
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
		Restarts: s.Restarts, LastExit: s.LastExit, LastLines: s.LastLines, Warnings: s.Warnings, Workers: []api.Worker{},
		DroppedLogLines: droppedLogLines(rt), Canary: apiCanary(s.Canary), LastCanary: apiCanaryEnd(s.LastCanary)}
	for _, l := range rt.config().Listen {
		app.Listen = append(app.Listen, l.URL)
	}
	app.Balance, app.Spares = s.Balance, s.Spares
	if want := rt.config().Balance; want != s.Balance && len(app.Listen) > 0 {
		app.Warnings = append(app.Warnings, fmt.Sprintf("balance %q asked, %q in effect (the agent log says why)", want, s.Balance))
	}
	for _, w := range s.Workers {
		app.Workers = append(app.Workers, apiWorker(w))
	}
	for _, w := range s.Draining {
		app.Draining = append(app.Draining, apiWorker(w))
	}
	return app
}

func apiWorker(w workers.WorkerStatus) api.Worker {
	aw := api.Worker{
		Slot: w.Slot, PID: w.PID, State: string(w.State), Release: w.Release, Generation: w.Generation,
		Restarts: w.Restarts, UptimeSeconds: w.Uptime.Seconds(),
		MemoryReplacements: w.MemoryReplacements, WatchdogReplacements: w.WatchdogReplacements, ReadyMillis: w.ReadyAfter.Milliseconds(),
		CPUPercent: w.CPUPercent, RSSBytes: w.RSSBytes, Status: w.Status,
		HealthReplacements: w.HealthReplacements, HealthFailures: w.HealthFailures,
		HealthFailuresTotal: w.HealthFailuresTotal, HealthError: w.HealthError, Spare: w.Spare,
	}
	if w.Steered {
		n := w.Connections
		aw.Connections = &n
	}
	if w.Recycles {
		in := w.RecycleIn.Seconds()
		aw.RecycleInSeconds = &in
	}
	return aw
}

// stream writes StreamLines to an HTTP answer; safe for concurrent use.
type stream struct {
	mu sync.Mutex
	w  http.ResponseWriter
	rc *http.ResponseController
	op *opWriter // logs the operation; nil outside a control request
}

func newStream(w http.ResponseWriter) *stream {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	op := opOf(w)
	if op != nil {
		op.streamStarted()
	}
	return &stream{w: w, rc: http.NewResponseController(w), op: op}
}

func (s *stream) send(l api.StreamLine) {
	if s == nil { // an operation nobody asked for over the socket (a canary's after hook)
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.op != nil {
		s.op.logLine(l)
	}
	// A client that went away does not stop the operation.
	_ = json.NewEncoder(s.w).Encode(l)
	_ = s.rc.Flush()
}

func (s *stream) event(e workers.Event) {
	ae := apiEvent(e)
	s.send(api.StreamLine{Event: &ae})
}

func (a *Agent) handleRestart(w http.ResponseWriter, r *http.Request) {
	a.runAppOp(w, r, func(rt *appRT, _ *stream) error {
		err := rt.sup.Restart(nil)
		if err == nil {
			err = a.state.update(rt.name, func(s *AppState) { s.Stopped = false })
		}
		return err
	})
}
