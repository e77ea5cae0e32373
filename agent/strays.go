package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/procunit"
	"github.com/deployd/deployd/workers"
)

// Strays are workers of a dead agent that no record names: the agent died
// (SIGKILL, a crash) between starting them and recording them, or could
// not record them. Each worker's environment starts with its agent's
// marker (workers.EnvAgentID): the installation (a hash of state_dir: the
// agents of other installations on the host are none of ours), the
// agent's pid and its start time. An agent that starts scans /proc for
// process group leaders that carry a marker of its installation whose
// agent is gone, and retires them with the survivors.

// maxEnviron bounds the read of a process's environment: the marker comes
// first, and the worker's app and slot follow the app's own variables.
const maxEnviron = 64 << 10

// strayStopTimeout is how long a stray gets after SIGTERM: its stop signal
// and timeout were never recorded.
const strayStopTimeout = 10 * time.Second

// agentMarker is the marker of this agent's workers.
func agentMarker(stateDir string) string {
	start, _ := handoff.StartTime(os.Getpid())
	return fmt.Sprintf("%s.%d.%d", installation(stateDir), os.Getpid(), start)
}

// installation names the agents that share stateDir.
func installation(stateDir string) string {
	if abs, err := filepath.Abs(stateDir); err == nil {
		stateDir = abs
	}
	sum := sha256.Sum256([]byte(stateDir))
	return hex.EncodeToString(sum[:8])
}

// strays lists the processes of this installation whose agent is gone,
// other than known (recorded survivors, this agent's own workers) and
// the processes a known worker left in its unit (units: their ids).
func strays(stateDir string, known map[int]bool, units map[string]bool) []survivor {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	prefix := workers.EnvAgentID + "=" + installation(stateDir) + "."
	var out []survivor
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == os.Getpid() || known[pid] {
			continue
		}
		// A worker leads its process group; its children (a gunicorn's
		// workers) go with it when it is retired.
		if pg, err := unix.Getpgid(pid); err != nil || pg != pid {
			continue
		}
		env, err := readEnviron(pid)
		if err != nil || !bytes.HasPrefix(env, []byte(prefix)) {
			continue
		}
		vars := parseEnviron(env)
		agentPID, agentStart, ok := parseMarker(strings.TrimPrefix(vars[workers.EnvAgentID], prefix[len(workers.EnvAgentID)+1:]))
		if !ok || agentPID == os.Getpid() || handoff.Running(agentPID, agentStart) {
			continue // its agent lives: a previous agent draining after a handoff
		}
		start, err := handoff.StartTime(pid)
		if err != nil {
			continue
		}
		slot, _ := strconv.Atoi(vars["DEPLOYD_WORKER"])
		p := workers.Process{Slot: slot, PID: pid, StartTime: start, StopSignal: syscall.SIGTERM,
			StopTimeout: strayStopTimeout}
		if id := vars[procunit.MarkerVar]; units[id] {
			// A process a known worker left (a setsid daemon): it goes when
			// that worker goes, with its unit. Retired here, it would take
			// the unit, and the worker in it, with it.
			continue
		} else if id != "" {
			// No record names its unit: found again from the process.
			u := procunit.Find(pid, id)
			p.Unit = &u
		}
		out = append(out, survivor{app: vars["DEPLOYD_APP"], agentPID: agentPID, stray: true, p: p})
	}
	return out
}

// readEnviron reads the start of pid's environment, at most maxEnviron
// bytes.
func readEnviron(pid int) ([]byte, error) {
	f, err := os.Open("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, maxEnviron))
}

// parseEnviron splits NUL-separated NAME=value pairs; the first of a name
// wins (a cut last one is dropped by the caller's lookups failing).
func parseEnviron(b []byte) map[string]string {
	vars := map[string]string{}
	for kv := range bytes.SplitSeq(b, []byte{0}) {
		k, v, ok := bytes.Cut(kv, []byte{'='})
		if _, seen := vars[string(k)]; ok && !seen {
			vars[string(k)] = string(v)
		}
	}
	return vars
}

// parseMarker reads "PID.START", the part of a marker after the
// installation.
func parseMarker(s string) (pid int, start uint64, ok bool) {
	p, st, found := strings.Cut(s, ".")
	if !found {
		return 0, 0, false
	}
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(st, 10, 64)
	return pid, start, err1 == nil && err2 == nil && pid > 0
}
