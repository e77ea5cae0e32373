package control

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"

	"github.com/deployd/deployd/agent/api"
)

// handleLogs answers GET /v1/logs?app=&n=&err=&follow=&resume= with
// api.LogLines: the last n lines of each log, then, with follow, every new
// line until the client goes away or the control server stops.
func (s *Server) handleLogs(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	n, err := queryInt(q.Get("n"), 20)
	if err != nil || n < 0 || n > api.MaxLogLines {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("bad request: n=%q: want 0 to %d lines", q.Get("n"), api.MaxLogLines))
		return
	}
	errLog, err1 := queryBool(q.Get("err"))
	follow, err2 := queryBool(q.Get("follow"))
	if err := errors.Join(err1, err2); err != nil {
		writeError(w, http.StatusBadRequest, "bad request: "+err.Error())
		return
	}
	req := api.LogsRequest{App: q.Get("app"), Lines: n, Err: errLog, Follow: follow}
	for _, v := range q["resume"] {
		p, err := api.ParseLogPos(v)
		if err != nil {
			writeError(w, http.StatusBadRequest, "bad request: "+err.Error())
			return
		}
		req.Resume = append(req.Resume, p)
	}
	// A client that stops reading holds no more than what a write takes:
	// its write times out (deadlineWriter), and that ends the call.
	ctx, gone := context.WithCancel(r.Context())
	defer gone()
	ls := newLogStream(w, gone)
	defer ls.close()
	if err := s.a.Logs(ctx, s.stopping(), req, ls); err != nil {
		writeErr(w, err)
	}
	if err := ls.failure(); errors.Is(err, os.ErrDeadlineExceeded) {
		kv := []any{"timeout", controlWriteTimeout}
		if p := peerOf(r.Context()); p != nil {
			kv = append(kv, "uid", p.UID, "client_pid", p.PID)
		}
		s.log.Warn("logs client dropped: it took nothing of its answer for too long", kv...)
	}
}
