package control

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/deployd/deployd/agent"
	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/version"
	"github.com/deployd/deployd/workers"
)

// handlers of the calls in Privileges, by "METHOD PATH".
func (s *Server) handlers() map[string]http.HandlerFunc {
	return map[string]http.HandlerFunc{
		"GET " + api.PathStatus:      s.handleStatus,
		"GET " + api.PathVersion:     s.handleVersion,
		"POST " + api.PathShutdown:   s.handleShutdown,
		"POST " + api.PathReload:     streamed(s.reload, resultLine),
		"POST " + api.PathRestart:    appOp(s, (*agent.Agent).Restart),
		"GET " + api.PathLogs:        s.handleLogs,
		"POST " + api.PathLogsRotate: s.logFiles((*agent.Agent).RotateLogFiles),
		"POST " + api.PathLogsFlush:  s.logFiles((*agent.Agent).EmptyLogFiles),
		"POST " + api.PathUpgrade:    s.handleUpgrade,
		"POST " + api.PathDeploy:     streamed(s.deploy, deployLine),
		"POST " + api.PathRollback:   streamed(s.rollback, deployLine),
		"GET " + api.PathReleases:    s.handleReleases,
		"POST " + api.PathScale:      streamed(s.scale, resultLine),
		"POST " + api.PathStop:       appOp(s, (*agent.Agent).Stop),
		"POST " + api.PathStart:      appOp(s, (*agent.Agent).Start),
		"POST " + api.PathPromote:    appOp(s, (*agent.Agent).Promote),
		"POST " + api.PathAbort:      appOp(s, (*agent.Agent).Abort),
		"POST " + api.PathPause:      streamed(s.pause, resultLine),
		"POST " + api.PathResume:     appOp(s, (*agent.Agent).Resume),
	}
}

// routes serves every call of the Privileges table, each behind its check.
// Every request is logged with its caller and what it asked.
func (s *Server) routes() http.Handler {
	mux := http.NewServeMux()
	hs := s.handlers()
	for _, p := range Privileges {
		mux.HandleFunc(p.Method+" "+p.Path, hs[p.Method+" "+p.Path])
	}
	log := s.log
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
			code, msg := http.StatusInternalServerError, err.Error()
			var mbe *http.MaxBytesError
			if errors.As(err, &mbe) {
				code, msg = http.StatusRequestEntityTooLarge, fmt.Sprintf("request too large: the limit is %d bytes", mbe.Limit)
			}
			log.Warn("control request refused", append(kv, "reason", msg)...)
			writeError(w, code, msg)
			return
		}
		ok, why := s.authorize(peer, r.Method, r.URL.Path)
		if ok {
			ok, why = s.authorizeApp(peer, r.Method, r.URL.Path, body)
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

// callerOf is the core's view of a request's caller.
func (s *Server) callerOf(r *http.Request) agent.Caller {
	peer := peerOf(r.Context())
	return agent.Caller{
		Owner:     peer != nil && peer.Role == RoleOwner,
		File:      func() (*os.File, error) { return passedFile(r.Context()) },
		MayChange: func(app *config.App) (bool, string) { return mayChange(peer, app) },
	}
}

// emitter is where an operation sends its progress.
type emitter = func(workers.Event)

// streamed serves a streamed operation whose request is a Req: it decodes
// the request and calls call with the request's progress stream; call's
// refusal (before any event) is answered as an error, else its result ends
// the stream as line(result).
func streamed[Req, Res any](call func(r *http.Request, req Req, emit emitter) (Res, error), line func(Res) api.StreamLine) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req Req
		if !decode(w, r, &req) {
			return
		}
		st := newStream(w)
		res, err := call(r, req, st.event)
		if err != nil {
			st.refuse(err)
			return
		}
		st.send(line(res))
	}
}

func resultLine(res *api.Result) api.StreamLine       { return api.StreamLine{Result: res} }
func deployLine(res *api.DeployResult) api.StreamLine { return api.StreamLine{Deploy: res} }

// appOp serves an operation on the app an api.AppRequest names.
func appOp(s *Server, op func(a *agent.Agent, ctx context.Context, app string, emit emitter) (*api.Result, error)) http.HandlerFunc {
	return streamed(func(r *http.Request, req api.AppRequest, emit emitter) (*api.Result, error) {
		return op(s.a, r.Context(), req.App, emit)
	}, resultLine)
}

func (s *Server) reload(r *http.Request, req api.ReloadRequest, emit emitter) (*api.Result, error) {
	return s.a.Reload(r.Context(), req, s.callerOf(r), emit)
}

func (s *Server) deploy(r *http.Request, req api.DeployRequest, emit emitter) (*api.DeployResult, error) {
	return s.a.Deploy(r.Context(), req, s.callerOf(r), emit)
}

func (s *Server) rollback(r *http.Request, req api.RollbackRequest, emit emitter) (*api.DeployResult, error) {
	return s.a.Rollback(r.Context(), req, emit)
}

func (s *Server) pause(r *http.Request, req api.PauseRequest, emit emitter) (*api.Result, error) {
	return s.a.Pause(r.Context(), req, emit)
}

func (s *Server) scale(r *http.Request, req api.ScaleRequest, emit emitter) (*api.Result, error) {
	return s.a.Scale(r.Context(), req, emit)
}

func (s *Server) handleUpgrade(w http.ResponseWriter, r *http.Request) {
	var req api.UpgradeRequest
	if !decode(w, r, &req) {
		return
	}
	answer(w)(s.a.Upgrade(r.Context(), req, s.callerOf(r)))
}

func (s *Server) handleReleases(w http.ResponseWriter, r *http.Request) {
	answer(w)(s.a.Releases(r.URL.Query().Get("app")))
}

func (s *Server) handleStatus(w http.ResponseWriter, r *http.Request) {
	answer(w)(s.a.Status(r.URL.Query().Get("app")))
}

// logFiles serves a call on the log files of the app a LogFilesRequest names.
func (s *Server) logFiles(op func(a *agent.Agent, app string) (*api.LogFilesResult, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		var req api.LogFilesRequest
		if !decode(w, r, &req) {
			return
		}
		answer(w)(op(s.a, req.App))
	}
}

func (s *Server) handleVersion(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, api.VersionInfo{Version: version.String(), PID: os.Getpid()})
}

func (s *Server) handleShutdown(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, struct{}{})
	s.a.Shutdown()
}
