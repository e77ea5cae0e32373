package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"runtime"
	"time"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/workers"
)

// handoverName is the tableflip file that carries the handover channel:
// the description and the channel ends of every worker the next agent
// adopts (SCM_RIGHTS parcels, handoff/parcel.go).
const handoverName = "deployd/handover"

// handoverHeader is the first parcel.
type handoverHeader struct {
	Version  int `json:"version"`
	AgentPID int `json:"agent_pid"`
	// RestartWorkers: the sender drains its workers itself (upgrade
	// --restart-workers); no worker parcel follows.
	RestartWorkers bool `json:"restart_workers,omitempty"`
	// Workers is how many parcels follow (version 2 on): a stream cut
	// short (the sender failed midway) makes the next agent give up rather
	// than start its own workers beside the ones it did not get.
	Workers int `json:"workers"`
	// Unhealthy (version 3 on) are the apps not running with every worker
	// ready under the sender (crash-looping, errored, stopped): whether
	// their workers get ready under the next agent does not decide the
	// upgrade, which only the agent's own readiness does.
	Unhealthy []string `json:"unhealthy,omitempty"`
}

// handoverVersion is the header's version; 2 added Workers, 3 the pool
// parcels (the state of each app: workerParcel.Pool) and Unhealthy.
const handoverVersion = 3

// workerParcel is the header of each following parcel: a worker, or
// (version 3 on) the state of an app's pool, which an agent of version 2
// skips.
type workerParcel struct {
	App    string                `json:"app"`
	Worker *workers.Handover     `json:"worker,omitempty"`
	Pool   *workers.PoolHandover `json:"pool,omitempty"`
}

// handing is a handover in flight in the sending agent.
type handing struct {
	apps []*appRT
	// mine is the sending end; theirs a copy of the end the next agent
	// reads, kept to empty the channel after a failed handoff (the fds in
	// flight would stay open in the queue).
	mine, theirs *os.File
	sent         chan error
}

// handOver freezes every app's pool (an app with an operation running
// refuses the upgrade: every pool is resumed), pauses the readers of its
// running workers and starts sending the state of every app, with the
// descriptions and channel ends of its workers, to the next agent through
// a channel it registers with tableflip. With restart the channel carries
// only the header: the next agent starts its own workers and this one
// drains its own, as before adoption existed.
func (u *upgrades) handOver(restart bool) (*handing, error) {
	h := &handing{sent: make(chan error, 1)}
	parcels := []handoff.Parcel{{}} // the header, once the count is known
	var hos []*workers.Handover
	var unhealthy []string
	for _, rt := range u.apps() {
		if restart {
			if !healthy(rt.sup.Status()) {
				unhealthy = append(unhealthy, rt.name)
			}
			continue
		}
		pool, ws, err := rt.sup.HandOverPool()
		if err != nil {
			for _, done := range h.apps {
				done.sup.Resume()
			}
			return nil, failWith(api.KindBusy, "app %s: %s; an agent upgrade takes every app over as it is, "+
				"but not in the middle of an operation: wait for it to finish, then upgrade", rt.name, busyText(err))
		}
		h.apps = append(h.apps, rt)
		if !pool.Healthy {
			unhealthy = append(unhealthy, rt.name)
		}
		b, _ := json.Marshal(workerParcel{App: rt.name, Pool: pool})
		parcels = append(parcels, handoff.Parcel{Header: b})
		for _, w := range ws {
			b, err := json.Marshal(workerParcel{App: rt.name, Worker: w})
			if err != nil {
				continue
			}
			parcels = append(parcels, handoff.Parcel{Header: b, Files: w.Files()})
			hos = append(hos, w)
		}
	}
	var err error
	if h.mine, h.theirs, err = handoff.NewHandoverChannel(); err == nil {
		if err = u.upg.Fds().AddFile(handoverName, h.theirs); err != nil {
			h.mine.Close()
			h.theirs.Close()
			err = fmt.Errorf("pass the handover channel: %w", err)
		}
	}
	if err != nil {
		for _, rt := range h.apps {
			rt.sup.Resume()
		}
		return nil, err
	}
	parcels[0].Header, _ = json.Marshal(handoverHeader{Version: handoverVersion, AgentPID: os.Getpid(),
		RestartWorkers: restart, Workers: len(parcels) - 1, Unhealthy: unhealthy})
	deadline := time.Now().Add(u.timeout)
	go func() {
		err := handoff.SendParcels(h.mine, parcels, deadline)
		if err != nil {
			u.log.Error("upgrade: handover send failed", "error", err)
		}
		for _, w := range hos {
			w.ReleaseFiles()
		}
		h.sent <- err
	}()
	u.log.Info("upgrade: handing over", "apps", len(h.apps), "workers", len(hos), "restart_workers", restart,
		"unhealthy", unhealthy)
	return h, nil
}

// healthy reports whether an app runs with every worker ready.
func healthy(st workers.AppStatus) bool {
	if st.State != workers.AppRunning || st.Busy != nil || len(st.Workers) != st.Instances+st.Spares {
		return false
	}
	for _, w := range st.Workers {
		if w.State != workers.Ready {
			return false
		}
	}
	return true
}

// busyText words a supervisor's refusal of the handover.
func busyText(err error) string {
	var be *workers.BusyError
	if errors.As(err, &be) {
		return fmt.Sprintf("%s is running since %s", be.Op, be.Since.Format(time.TimeOnly))
	}
	return err.Error()
}

// failed undoes handOver: the readers read on, operations are admitted.
func (h *handing) failed() {
	h.mine.Close()
	<-h.sent
	if ps, err := handoff.ReceiveParcels(h.theirs, time.Now().Add(time.Second)); err == nil {
		for _, p := range ps {
			closeAll(p.Files)
		}
	}
	h.theirs.Close()
	for _, rt := range h.apps {
		rt.sup.Resume()
	}
	// tableflip leaves two fds per attempt to the garbage collector: its
	// copies of the pipes it gave the child (startChild never closes
	// readyW and namesR), and its dup of the previous attempt's handover
	// channel, which AddFile replaced in its table without closing. Only
	// the os.File finalizers close them; collect now so that a failed
	// upgrade leaves the fd count where it was (plus this attempt's dup,
	// which the next attempt replaces: tableflip cannot drop a file).
	runtime.GC()
}

// succeeded closes the copy of the next agent's end.
func (h *handing) succeeded() { h.theirs.Close() }

// received is what a new agent got from the previous one.
type received struct {
	restart bool
	byApp   map[string][]*workers.Handover
	// pools are the apps' states (version 3 on); unhealthy the apps whose
	// readiness does not decide the upgrade.
	pools     map[string]*workers.PoolHandover
	unhealthy map[string]bool
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}
