package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/internal/sockdiag"
	"github.com/deployd/deployd/workers"
)

// The invariant an adopting start ends with (a start that took workers over
// from a previous agent, through a handoff or from a dead agent's record):
// every process that holds one of an app's listening sockets is a worker
// this agent supervises, a process in such a worker's unit (a gunicorn's
// forked workers, a daemon it started), this agent, one of its ancestors
// (the service manager holding a socket unit's sockets), or a previous
// agent of this installation still winding down (its record names it). Any
// other holder serves the app's port while no agent supervises it and
// `status` does not list it (a worker a dead agent left in its steering
// group, one started while it died); it is SIGKILLed through a pidfd and
// logged with its app, pid, command and why.
//
// The holders come from the kernel, not from records: the app's TCP
// listening sockets from sock_diag (every socket bound to the address,
// which for a steered listener is every worker's own socket of its
// reuseport group), a unix listener's from the agent's own socket, and
// the processes that hold them from /proc/PID/fd of every process.

// holderKillWait bounds the wait for a killed holder to exit.
const holderKillWait = 5 * time.Second

// appSocket is one listening socket of an app, by inode.
type appSocket struct {
	app    string
	listen string // "tcp 127.0.0.1:8080", as status names it
}

// holder is a process that holds an app's listening socket.
type holder struct {
	pid   int
	start uint64
	ino   uint64 // the socket's inode
	sock  appSocket
}

// holders checks that invariant. It sees the apps through the func it was
// given; stopping is set as the agent's teardown starts (its workers stop,
// none is a stray).
type holders struct {
	log      hclog.Logger
	stateDir string
	apps     func() []*appRT
	stopping *atomic.Bool
}

// afterAdopting runs once this agent is ready: it stops what it took over
// and does not keep (a handoff's leftovers, a dead agent's survivors) and
// then, after an adopting start whose previous agent is gone, enforces
// the invariant that only supervised workers hold the apps' listening
// sockets (above).
func (a *Agent) afterAdopting() {
	var wg sync.WaitGroup
	parentGone := true
	wg.Go(func() { parentGone = a.survivors.retireLater() })
	wg.Go(func() {
		eachApp(a.apps.list(), func(rt *appRT) { rt.sup.StopLeftovers() })
		a.takeover.retireOrphans()
	})
	wg.Wait()
	if !a.adopting || !parentGone {
		return
	}
	socks, killed := a.holders.enforce()
	a.log.Info("checked the holders of the apps' listening sockets after taking workers over",
		"sockets", socks, "killed", len(killed))
}

// enforce checks the invariant above and kills the holders that
// break it; it returns them. Run once the previous agent is gone and this
// agent's leftovers and survivors are stopped (afterAdopting).
func (k *holders) enforce() (sockets int, killed []holder) {
	socks, err := k.listeningSockets()
	if err != nil {
		k.log.Warn("cannot list the apps' listening sockets: the check that no unsupervised process serves is skipped",
			"error", err)
		return 0, nil
	}
	if len(socks) == 0 {
		return 0, nil
	}
	for _, h := range socketHolders(socks, ancestors()) {
		// Workers started since the scan count: the supervised set is read
		// after the holders were found. An agent that stops has none.
		if why := k.unsupervised(h); why != "" && !k.stopping.Load() {
			if k.kill(h, why) {
				killed = append(killed, h)
			}
		}
	}
	return len(socks), killed
}

// listeningSockets are the inodes of every app's listening sockets.
func (k *holders) listeningSockets() (map[uint64]appSocket, error) {
	out := map[uint64]appSocket{}
	tcp := map[netip.AddrPort]appSocket{}
	for _, rt := range k.apps() {
		spec := rt.sup.Spec()
		if spec == nil {
			continue
		}
		for _, b := range spec.Listeners {
			s := appSocket{app: rt.name, listen: b.Network + " " + b.Address}
			if ino, err := b.Inode(); err == nil {
				out[ino] = s // the agent's own: a shared listener, a unix socket
			}
			if b.Network == "unix" {
				continue
			}
			if la, err := b.LocalAddr(); err == nil {
				if ap, err := netip.ParseAddrPort(la); err == nil {
					tcp[netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())] = s
				}
			}
		}
	}
	if len(tcp) == 0 {
		return out, nil
	}
	ls, err := sockdiag.TCP([]sockdiag.State{sockdiag.Listen}, func(k *sockdiag.Socket) bool {
		_, ok := tcp[netip.AddrPortFrom(k.Local.Addr().Unmap(), k.Local.Port())]
		return ok
	})
	if err != nil {
		return nil, fmt.Errorf("dump the listening TCP sockets: %w", err)
	}
	for _, k := range ls {
		out[k.Inode] = tcp[netip.AddrPortFrom(k.Local.Addr().Unmap(), k.Local.Port())]
	}
	return out, nil
}

// socketHolders scans /proc for the processes (other than skip) that hold
// one of socks.
func socketHolders(socks map[uint64]appSocket, skip map[int]bool) []holder {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []holder
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || skip[pid] {
			continue
		}
		held, err := sockdiag.Inodes(pid)
		if err != nil {
			continue // gone, or a kernel thread
		}
		for ino := range held {
			if s, ok := socks[ino]; ok {
				if start, err := handoff.StartTime(pid); err == nil {
					out = append(out, holder{pid: pid, start: start, ino: ino, sock: s})
				}
				break
			}
		}
	}
	return out
}

// ancestors are this agent and the processes it descends from: its
// service manager, a previous agent still draining.
func ancestors() map[int]bool {
	out := map[int]bool{}
	for pid := os.Getpid(); pid > 0 && !out[pid]; {
		out[pid] = true
		ppid, err := parentOf(pid)
		if err != nil {
			break
		}
		pid = ppid
	}
	return out
}

// parentOf reads pid's parent from /proc/PID/stat.
func parentOf(pid int) (int, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	// PID (COMM) STATE PPID ...: the name may hold spaces and ')'.
	i := strings.LastIndexByte(string(b), ')')
	f := strings.Fields(string(b[i+1:]))
	if i < 0 || len(f) < 2 {
		return 0, fmt.Errorf("/proc/%d/stat: unexpected %q", pid, b)
	}
	return strconv.Atoi(f[1])
}

// unsupervised says why h breaks the invariant, "" when it does not: it is
// a worker of this agent or in one's unit, or this agent's child (a worker
// it is starting: the shim before its exec).
func (k *holders) unsupervised(h holder) string {
	for _, rt := range k.apps() {
		for _, p := range rt.sup.Processes() {
			if p.PID == h.pid && p.StartTime == h.start || p.Unit != nil && procunit.Reopen(*p.Unit).Has(h.pid) {
				return ""
			}
		}
	}
	if ppid, err := parentOf(h.pid); err == nil && ppid == os.Getpid() {
		return ""
	}
	if k.agentOfThisInstallation(h) {
		return "" // a previous agent winding down: it closes its copies before it exits
	}
	why := "it is not a worker this agent supervises, nor a process of one"
	if env, err := readEnviron(h.pid); err == nil {
		vars := parseEnviron(env)
		if m := vars[workers.EnvAgentID]; strings.HasPrefix(m, installation(k.stateDir)+".") {
			why += fmt.Sprintf(" (a worker of app %q, slot %s, started by agent %s of this installation)",
				vars["DEPLOYD_APP"], vars["DEPLOYD_WORKER"], strings.TrimPrefix(m, installation(k.stateDir)+"."))
		}
	}
	return why
}

// agentOfThisInstallation reports whether h is an agent that shares this
// one's state_dir: its record names its pid and start time. An agent's
// record outlives its copies of the listeners (teardown removes it last).
func (k *holders) agentOfThisInstallation(h holder) bool {
	b, err := os.ReadFile(filepath.Join(recordsDir(k.stateDir), strconv.Itoa(h.pid)+".json"))
	var rec agentRecord
	return err == nil && json.Unmarshal(b, &rec) == nil && rec.AgentPID == h.pid && rec.AgentStart == h.start
}

// kill SIGKILLs h through a pidfd, once that pidfd is known to be h
// (pid and start time) still holding the socket, and logs it. It reports
// whether it killed.
func (k *holders) kill(h holder, why string) bool {
	pfd, err := handoff.OpenPidfd(h.pid, h.start)
	if err != nil {
		return false // gone since the scan
	}
	defer pfd.Close()
	if held, err := sockdiag.Inodes(h.pid); err != nil || !held[h.ino] {
		return false // closed it since the scan: it no longer serves
	}
	cmd := command(h.pid)
	log := k.log.With("app", h.sock.app, "listen", h.sock.listen, "pid", h.pid, "command", cmd, "why", why)
	if err := pfd.Signal(syscall.SIGKILL); err != nil {
		if !errors.Is(err, handoff.ErrNotSameProcess) {
			log.Error("a process holds an app's listening socket and no agent supervises it; it could not be killed",
				"error", err)
		}
		return false
	}
	if !waitPidfd(pfd, holderKillWait) {
		log.Error("killed a process that held an app's listening socket, unsupervised; it has not exited yet")
		return true
	}
	log.Warn("killed a process that held an app's listening socket and no agent supervised it")
	return true
}

// command is pid's command line, at most 200 bytes, spaces between the
// arguments.
func command(pid int) string {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return ""
	}
	defer f.Close()
	b := make([]byte, 200)
	n, _ := f.Read(b)
	return strings.TrimSpace(strings.ReplaceAll(string(b[:n]), "\x00", " "))
}
