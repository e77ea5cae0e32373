package control

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"slices"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent"
	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/agent/config"
)

// Role is what a caller of the control socket is, from its SO_PEERCRED.
type Role int

// Roles, weakest first.
const (
	RoleNone   Role = iota // may do nothing
	RoleMember             // in [agent] socket_group
	RoleOwner              // root or the agent's own uid
)

func (r Role) String() string {
	switch r {
	case RoleOwner:
		return "owner"
	case RoleMember:
		return "member"
	}
	return "none"
}

// Need is what a call of the control API asks of its caller.
type Need int

// Needs of the calls.
const (
	NeedMember       Need = iota // socket_group members and owners
	NeedMemberSigned             // owners; members only with a binary signed for upgrade_public_key
	NeedOwner                    // root and the agent's uid only
)

// Privileges is the privilege model: the one table of who may call what.
// docs/commands.md ("Who may do what") and SECURITY.md print it; a test checks they
// agree. Whoever may deploy may run code as the app's user (the release is
// the app's code), so run each app under its own `user`.
var Privileges = []struct {
	Method, Path string
	Need         Need
}{
	{"GET", api.PathStatus, NeedMember},
	{"GET", api.PathVersion, NeedMember},
	{"GET", api.PathReleases, NeedMember},
	{"GET", api.PathLogs, NeedMember},
	{"POST", api.PathReload, NeedMember},
	{"POST", api.PathRestart, NeedMember},
	{"POST", api.PathDeploy, NeedMember},
	{"POST", api.PathRollback, NeedMember},
	{"POST", api.PathScale, NeedMember},
	{"POST", api.PathStop, NeedMember},
	{"POST", api.PathStart, NeedMember},
	{"POST", api.PathPromote, NeedMember},
	{"POST", api.PathAbort, NeedMember},
	{"POST", api.PathPause, NeedMember},
	{"POST", api.PathResume, NeedMember},
	{"POST", api.PathLogsRotate, NeedMember},
	{"POST", api.PathLogsFlush, NeedMember},
	{"POST", api.PathUpgrade, NeedMemberSigned},
	{"POST", api.PathShutdown, NeedOwner},
}

// needOf returns the Need of a call; ok is false for a call not in the table.
func needOf(method, path string) (Need, bool) {
	for _, p := range Privileges {
		if p.Method == method && p.Path == path {
			return p.Need, true
		}
	}
	return NeedOwner, false
}

// Peer is the process at the other end of a control connection, as the
// kernel reported it when it connected (SO_PEERCRED, SO_PEERGROUPS).
type Peer struct {
	PID, UID, GID int
	Groups        []int // supplementary groups
	Role          Role
}

type peerKey struct{}

// peerOf returns the peer of a request's connection (nil: unknown).
func peerOf(ctx context.Context) *Peer {
	p, _ := ctx.Value(peerKey{}).(*Peer)
	return p
}

// connContext stores the client's credentials and its connection in the
// connection's context.
func (s *Server) connContext(ctx context.Context, c net.Conn) context.Context {
	fc, ok := c.(*api.FileConn)
	if !ok {
		return ctx
	}
	ctx = context.WithValue(ctx, fileConnKey{}, fc)
	raw, err := fc.SyscallConn()
	if err != nil {
		return ctx
	}
	var p *Peer
	_ = raw.Control(func(fd uintptr) {
		cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED)
		if err != nil {
			return
		}
		p = &Peer{PID: int(cred.Pid), UID: int(cred.Uid), GID: int(cred.Gid), Groups: peerGroups(int(fd))}
	})
	if p == nil {
		return ctx
	}
	p.Role = s.roleOf(p)
	return context.WithValue(ctx, peerKey{}, p)
}

type fileConnKey struct{}

// passedFile returns the file the client passed with this request.
func passedFile(ctx context.Context) (*os.File, error) {
	fc, _ := ctx.Value(fileConnKey{}).(*api.FileConn)
	if fc == nil {
		return nil, api.ErrNoFile
	}
	return fc.TakeFile()
}

// peerGroups returns the supplementary groups of the peer of fd
// (SO_PEERGROUPS, Linux 4.13+); nil when the kernel cannot tell.
func peerGroups(fd int) []int {
	buf := make([]uint32, 64)
	for range 2 {
		n := uint32(len(buf) * 4)
		_, _, errno := unix.Syscall6(unix.SYS_GETSOCKOPT, uintptr(fd), unix.SOL_SOCKET, unix.SO_PEERGROUPS,
			uintptr(unsafe.Pointer(&buf[0])), uintptr(unsafe.Pointer(&n)), 0)
		if errno == unix.ERANGE {
			buf = make([]uint32, n/4+1)
			continue
		}
		if errno != 0 {
			return nil
		}
		out := make([]int, 0, n/4)
		for _, g := range buf[:n/4] {
			out = append(out, int(g))
		}
		return out
	}
	return nil
}

// roleOf: root and the agent's uid are owners; a peer whose gid or one of
// whose supplementary groups is socket_group is a member.
func (s *Server) roleOf(p *Peer) Role {
	if isOwnerUID(p.UID) {
		return RoleOwner
	}
	if g := s.settings.SocketGroup; g != "" {
		if gid, err := agent.LookupGroup(g); err == nil && (p.GID == gid || slices.Contains(p.Groups, gid)) {
			return RoleMember
		}
	}
	return RoleNone
}

// authorize says whether p may make the call; why explains a refusal.
// NeedMemberSigned lets members through: the upgrade itself then requires a
// signature (upgradeRules).
func (s *Server) authorize(p *Peer, method, path string) (bool, string) {
	if p == nil {
		return false, "permission denied: the agent could not read the client's credentials"
	}
	need, _ := needOf(method, path)
	switch {
	case p.Role == RoleNone:
		return false, fmt.Sprintf("permission denied: uid %d may not control this agent; run as root or as uid %d%s",
			p.UID, os.Getuid(), s.groupHint())
	case p.Role == RoleOwner, need != NeedOwner:
		return true, ""
	}
	return false, fmt.Sprintf("permission denied: %s %s is for root and the agent's uid %d only; members of socket_group may not do it",
		method, path, os.Getuid())
}

func (s *Server) groupHint() string {
	if g := s.settings.SocketGroup; g != "" {
		return ", or as a member of socket_group " + g
	}
	return ""
}

// changesApp are the calls that start, stop or replace an app's workers or
// its release, and so run (or choose) code as the app's user. A member may
// make them on an app that runs as root only with members_may_run_as_root.
var changesApp = map[string]bool{
	"POST " + api.PathDeploy:   true,
	"POST " + api.PathRollback: true,
	"POST " + api.PathReload:   true, // checked by the core's Reload (agent.Caller), against the config it loads
	"POST " + api.PathRestart:  true,
	"POST " + api.PathScale:    true,
	"POST " + api.PathStop:     true,
	"POST " + api.PathStart:    true,
	"POST " + api.PathPromote:  true,
	"POST " + api.PathAbort:    true,
}

// mayChange says whether p may change app (a call of changesApp); why
// explains a refusal and names the key that would allow it.
func mayChange(p *Peer, app *config.App) (bool, string) {
	if p == nil || p.Role != RoleMember || app == nil || app.MembersMayRunAsRoot || !agent.RunsAsRoot(app) {
		return true, ""
	}
	return false, fmt.Sprintf("permission denied: app %s runs as root (no `user`, or a user with uid 0, under an agent "+
		"that runs as root), and members of socket_group may not deploy, roll back, reload, restart, scale, stop, start, "+
		"promote or abort it: that runs code as root. Set user = \"NAME\" in [apps.%s] to run it as an unprivileged "+
		"user, or members_may_run_as_root = true there to allow members anyway", app.Name, app.Name)
}

// authorizeApp applies mayChange to the app a request names (the running
// config's; reload checks the one it loads). body is the request's body.
func (s *Server) authorizeApp(p *Peer, method, path string, body []byte) (bool, string) {
	call := method + " " + path
	if p == nil || p.Role != RoleMember || !changesApp[call] || call == "POST "+api.PathReload {
		return true, ""
	}
	var req struct {
		App string `json:"app"`
	}
	if json.Unmarshal(body, &req) != nil {
		return true, "" // the handler answers the bad request
	}
	app := s.a.AppConfig(req.App)
	if app == nil {
		return true, "" // the handler answers: no such app
	}
	return mayChange(p, app)
}
