package agent

import (
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"time"

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
	// Workers is how many worker parcels follow (version 2 on): a stream
	// cut short (the sender failed midway) makes the next agent give up
	// rather than start its own workers beside the ones it did not get.
	Workers int `json:"workers"`
}

// handoverVersion is the header's version; 2 added Workers.
const handoverVersion = 2

// workerParcel is the header of each following parcel.
type workerParcel struct {
	App    string            `json:"app"`
	Worker *workers.Handover `json:"worker"`
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

// handOver freezes every app's pool, pauses the readers of its ready
// workers and starts sending their descriptions and channel ends to the
// next agent, through a channel it registers with tableflip. With restart
// the channel carries only the header: the next agent starts its own
// workers and this one drains its own, as before adoption existed.
func (a *Agent) handOver(restart bool) (*handing, error) {
	mine, theirs, err := handoff.NewHandoverChannel()
	if err != nil {
		return nil, err
	}
	if err = a.upg.Fds().AddFile(handoverName, theirs); err != nil {
		mine.Close()
		theirs.Close()
		return nil, fmt.Errorf("pass the handover channel: %w", err)
	}
	h := &handing{mine: mine, theirs: theirs, sent: make(chan error, 1)}
	parcels := []handoff.Parcel{{}} // the header, once the count is known
	var hos []*workers.Handover
	if !restart {
		for _, rt := range a.appList() {
			ws, err := rt.sup.HandOver()
			if err != nil {
				// An operation runs: the next agent starts this app's
				// workers and this one drains its own.
				a.log.Warn("upgrade: app not handed over", "app", rt.name, "error", err)
				continue
			}
			h.apps = append(h.apps, rt)
			for _, w := range ws {
				b, err := json.Marshal(workerParcel{App: rt.name, Worker: w})
				if err != nil {
					continue
				}
				parcels = append(parcels, handoff.Parcel{Header: b, Files: w.Files()})
				hos = append(hos, w)
			}
		}
	}
	parcels[0].Header, _ = json.Marshal(handoverHeader{Version: handoverVersion, AgentPID: os.Getpid(),
		RestartWorkers: restart, Workers: len(parcels) - 1})
	deadline := time.Now().Add(a.settings.UpgradeTimeout)
	go func() {
		err := handoff.SendParcels(mine, parcels, deadline)
		if err != nil {
			a.log.Error("upgrade: handover send failed", "error", err)
		}
		for _, w := range hos {
			w.ReleaseFiles()
		}
		h.sent <- err
	}()
	a.log.Info("upgrade: handing over", "workers", len(parcels)-1, "restart_workers", restart)
	return h, nil
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
}

// receiveHandover reads the previous agent's handover, if it sent one.
// Only a parcel stream from our own parent counts.
func (a *Agent) receiveHandover() (*received, error) {
	if !a.upg.HasParent() {
		return nil, nil
	}
	f, err := a.upg.Fds().File(handoverName)
	if err != nil || f == nil {
		return nil, err
	}
	defer f.Close()
	ps, err := handoff.ReceiveParcels(f, time.Now().Add(a.settings.UpgradeTimeout))
	if err != nil {
		return nil, err
	}
	r := &received{byApp: map[string][]*workers.Handover{}}
	var hdr handoverHeader
	if len(ps) == 0 || json.Unmarshal(ps[0].Header, &hdr) != nil || hdr.AgentPID != os.Getppid() {
		for _, p := range ps {
			closeAll(p.Files)
		}
		return nil, fmt.Errorf("handover channel: no header from the parent agent %d", os.Getppid())
	}
	if hdr.Version >= 2 && len(ps)-1 != hdr.Workers {
		for _, p := range ps {
			closeAll(p.Files)
		}
		return nil, fmt.Errorf("handover channel: %d of the %d workers the parent agent %d handed over arrived",
			len(ps)-1, hdr.Workers, os.Getppid())
	}
	r.restart = hdr.RestartWorkers
	for _, p := range ps[1:] {
		var wp workerParcel
		if err := json.Unmarshal(p.Header, &wp); err != nil || wp.Worker == nil {
			closeAll(p.Files)
			continue
		}
		wp.Worker.SetFiles(p.Files)
		r.byApp[wp.App] = append(r.byApp[wp.App], wp.Worker)
	}
	return r, nil
}

func closeAll(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// stopLeftovers stops, once this agent has taken over, the workers of the
// previous agent it did not adopt.
func (a *Agent) stopLeftovers() {
	eachApp(a.appList(), func(rt *appRT) { rt.sup.StopLeftovers() })
	a.retireOrphans(a.orphans)
	a.orphans = nil
}

// retireOrphans stops the handed-over workers of apps this agent does not
// run (removed from the config, or stopped): a supervisor with no slots
// adopts nothing and retires every one.
func (a *Agent) retireOrphans(byApp map[string][]*workers.Handover) {
	for app, hs := range byApp {
		sup := workers.New(workers.Options{App: app, Shim: a.shim, Logger: a.log.Named("workers")},
			&workers.Spec{Release: "retired"})
		if err := sup.Adopt(hs); err != nil {
			a.log.Warn("retire workers of the previous agent", "app", app, "error", err)
		}
		sup.Stop()
	}
}
