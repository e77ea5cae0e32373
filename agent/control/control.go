// Package control is the agent's edge, as thin as it can be: it serves the
// core's operations (package agent) to clients. For each call of the
// control API on the Unix socket it decodes the request, authorizes the
// caller (the privilege table, from the kernel's SO_PEERCRED), calls the
// core, maps its typed error to an HTTP status and an api.Error, and
// streams the core's progress events and result as JSON lines; it caps the
// connections per uid and logs every call. It also serves the Prometheus
// metrics endpoint. The wire types are agent/api's; nothing here decides
// what happens to an app.
package control

import (
	"context"
	"net"
	"os"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/agent"
	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
)

// Server serves one agent: the control API on its control socket and the
// metrics endpoint. It is the agent's Edge (agent.Options.Edge = New).
type Server struct {
	a        *agent.Agent
	settings config.Agent
	log      hclog.Logger // "control"

	ctl     *controlServer
	ln      net.Listener   // the control socket, behind the connection limits
	metrics *metricsServer // nil when [agent] metrics is off
}

// New builds the server of a on its control socket ctl and its metrics
// listener (nil: metrics off). Nothing is served before Serve.
func New(a *agent.Agent, ctl, metrics net.Listener, log hclog.Logger) agent.Edge {
	s := &Server{a: a, settings: a.Settings(), log: log.Named("control")}
	nofile, err := raiseNoFile()
	if err != nil {
		s.log.Warn("read RLIMIT_NOFILE; control connection limits assume 1024", "error", err)
		nofile = 1024
	}
	lim := limitsFor(nofile)
	s.log.Debug("control connection limits", "nofile", nofile, "per_uid", lim.PerUID, "others", lim.Others, "owners", lim.Owners)
	cl := newConnLimiter(controlListener(ctl), lim, isOwnerUID, s.log)
	s.ctl = newControlServer(s.routes(), s.connContext, cl, s.log)
	s.ln = cl
	if metrics != nil {
		s.metrics = newMetricsServer(a, metrics, log.Named("metrics"))
	}
	return s
}

// Serve serves the metrics endpoint (in the background) and the control
// API until Stop; it returns nil when Stop ended it.
func (s *Server) Serve() error {
	s.metrics.start()
	return s.ctl.serve(s.ln)
}

// Stop stops the control server (controlServer.stop) and the metrics
// server. Safe to call twice.
func (s *Server) Stop() {
	s.ctl.stop(s.ln)
	s.metrics.Stop()
}

// stopping is cancelled when the control server begins to stop: streams
// that last as long as their client wants end on it.
func (s *Server) stopping() context.Context { return s.ctl.stopping }

// controlListener makes every connection of the control socket keep the
// file descriptors clients pass (api.FileConn).
func controlListener(l net.Listener) net.Listener {
	if ul, ok := l.(*net.UnixListener); ok {
		return api.FileListener{UnixListener: ul}
	}
	return l
}

// isOwnerUID: root and the agent's own uid (RoleOwner).
func isOwnerUID(uid int) bool { return uid == 0 || uid == os.Getuid() }
