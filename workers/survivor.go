package workers

import (
	"context"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/deployd/deployd/handoff"
	"github.com/deployd/deployd/internal/failpoint"
	"github.com/deployd/deployd/internal/procunit"
)

// Process identifies one worker process for the agent's survivor records:
// what a later agent needs to adopt it (TakeBack) or retire it if this one
// dies without a handoff (SIGKILL, crash).
type Process struct {
	Slot        int            `json:"slot"`
	PID         int            `json:"pid"`
	StartTime   uint64         `json:"start_time"`
	StopSignal  syscall.Signal `json:"stop_signal"`
	StopTimeout time.Duration  `json:"stop_timeout"`
	// Listen are its listening sockets: network and address as configured.
	Listen []Listen `json:"listen,omitempty"`
	// Kept are the fd numbers at which the process holds copies of the
	// agent's ends (handoff.KeepFD), by stream; none: it cannot be adopted.
	Kept map[string]int `json:"kept,omitempty"`
	// What its Handover would say, for the agent that adopts it.
	Identity   string    `json:"identity,omitempty"`
	Release    string    `json:"release,omitempty"`
	Generation int       `json:"generation,omitempty"`
	Started    time.Time `json:"started,omitzero"`
	ReadyAt    time.Time `json:"ready_at,omitzero"`
	// Unit finds its unit again (Handover.Unit).
	Unit *procunit.Record `json:"unit,omitempty"`
}

// Listen is one listening socket of a worker.
type Listen struct {
	Network string `json:"network"`
	Address string `json:"address"`
}

// Processes lists every live worker process of the pool (current, starting
// and draining ones).
func (s *Supervisor) Processes() []Process {
	var out []Process
	s.read(func(st *state) {
		for _, w := range st.workers() {
			if w.PID == 0 || w.State() == Exited || st.handedOver[w] {
				continue
			}
			p := Process{Slot: w.Slot, PID: w.PID, StartTime: w.startTime,
				StopSignal: w.spec.StopSignal, StopTimeout: w.spec.StopTimeout, Kept: w.kept,
				Identity: w.spec.Identity(), Release: w.Release, Generation: w.Generation, Started: w.Started,
				Unit: w.unitRecord()}
			w.mu.Lock()
			p.ReadyAt = w.readyAt
			w.mu.Unlock()
			for _, l := range w.spec.Listeners {
				p.Listen = append(p.Listen, Listen{l.Network, l.Address})
			}
			out = append(out, p)
		}
	})
	return out
}

// Retire stops a process that a dead agent left running, if it is still
// that process (pid and start time): its stop signal, then after its stop
// timeout SIGKILL to it and its process group (each process through a
// checked pidfd). It returns when the process is gone;
// ErrNotSameProcess (wrapped) when it was gone already. Either way, what is
// left of its unit (p.Unit: daemons it started) is killed then, and
// returned, and its cgroup removed.
func Retire(p Process) ([]procunit.Proc, error) {
	err := retire(p)
	if p.Unit == nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
	defer cancel()
	left, uerr := procunit.Reopen(*p.Unit).End(ctx)
	if err == nil || errors.Is(err, handoff.ErrNotSameProcess) && uerr != nil {
		err = uerr
	}
	return left, err
}

// EndIfGone kills what survivor p left running if p itself is gone (it
// died while no agent ran): nothing supervises those processes, and a
// setsid daemon among them may hold the app's listening socket, which the
// next agent must bind. It returns them; nothing while p runs, or for a
// survivor whose agent recorded no unit.
func EndIfGone(p Process) ([]procunit.Proc, error) {
	if p.Unit == nil || handoff.Running(p.PID, p.StartTime) {
		return nil, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
	defer cancel()
	return procunit.Reopen(*p.Unit).End(ctx)
}

func retire(p Process) error {
	pfd, err := handoff.OpenPidfd(p.PID, p.StartTime)
	if err != nil {
		return err
	}
	defer pfd.Close()
	sig := p.StopSignal
	if sig == 0 {
		sig = syscall.SIGTERM
	}
	failpoint.DelaySignal() // a stress run's late signal; nothing otherwise
	_ = pfd.Signal(sig)
	done := make(chan error, 1)
	go func() { done <- pfd.Wait() }()
	t := time.NewTimer(max(p.StopTimeout, time.Second))
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	// The group too: children left behind, each through a pidfd and only
	// while the leader still holds its pid (not the group id: the leader is
	// not our child, and once its parent reaps it the id may be anyone's).
	g := processGroup(p.PID, p.StartTime)
	ctx, cancel := context.WithTimeout(context.Background(), sweepTimeout)
	_ = g.Kill(ctx)
	cancel()
	g.Close()
	_ = pfd.Signal(syscall.SIGKILL)
	if err := <-done; err != nil && !errors.Is(err, handoff.ErrNotSameProcess) {
		return err
	}
	return nil
}

// ErrNotKept means a survivor cannot be adopted: it holds none of the
// agent's ends (started by an agent that did not keep them), or not all.
var ErrNotKept = errors.New("workers: the worker does not hold its channels for the next agent")

// TakeBack describes a worker that a dead agent left running (p, from that
// agent's record) as a Handover that Adopt takes, the way an agent upgrade
// hands a worker over: it checks through a pidfd that p.PID is still the
// recorded process and copies out of it (pidfd_getfd) the agent's ends it
// keeps (handoff.KeepFD): its notify socket and the read ends of its output
// pipes, where its output waited since the agent died, and its node-ipc
// channel. The error says why it cannot be adopted (then retire it).
func TakeBack(p Process) (*Handover, error) {
	if len(p.Kept) == 0 || p.Identity == "" {
		return nil, ErrNotKept
	}
	pfd, err := handoff.OpenPidfd(p.PID, p.StartTime)
	if err != nil {
		return nil, err
	}
	defer pfd.Close()
	h := &Handover{Slot: p.Slot, PID: p.PID, StartTime: p.StartTime, Generation: p.Generation,
		Release: p.Release, Identity: p.Identity, Started: p.Started, ReadyAt: p.ReadyAt,
		StopSignal: p.StopSignal, StopTimeout: p.StopTimeout, Kept: p.Kept, Unit: p.Unit, files: map[string]*os.File{}}
	for _, name := range []string{"notify", "out", "err", "outj", "errj", "ipc", "node", trapStream} {
		n, ok := p.Kept[name]
		if !ok {
			continue
		}
		f, err := pfd.GetFd(n, name)
		if err == nil && (name == "out" || name == "err") && !handoff.IsPipeReadEnd(f) {
			f.Close()
			err = fmt.Errorf("fd %d is not the read end of a pipe", n)
		}
		if err != nil {
			h.closeFiles(true)
			return nil, fmt.Errorf("pid %d: its %s channel: %w: %w", p.PID, name, ErrNotKept, err)
		}
		h.files[name] = f
		h.Streams = append(h.Streams, name)
	}
	return h, nil
}
