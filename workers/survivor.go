package workers

import (
	"errors"
	"syscall"
	"time"

	"github.com/deployd/deployd/handoff"
)

// Process identifies one worker process for the agent's survivor records:
// what a later agent needs to retire it if this one dies without a
// handoff (SIGKILL, crash).
type Process struct {
	Slot        int            `json:"slot"`
	PID         int            `json:"pid"`
	StartTime   uint64         `json:"start_time"`
	StopSignal  syscall.Signal `json:"stop_signal"`
	StopTimeout time.Duration  `json:"stop_timeout"`
	// Listen are its listening sockets: network and address as configured.
	Listen []Listen `json:"listen,omitempty"`
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
				StopSignal: w.spec.StopSignal, StopTimeout: w.spec.StopTimeout}
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
// timeout SIGKILL to its process group. It returns when the process is gone;
// ErrNotSameProcess (wrapped) when it was gone already.
func Retire(p Process) error {
	pfd, err := handoff.OpenPidfd(p.PID, p.StartTime)
	if err != nil {
		return err
	}
	defer pfd.Close()
	sig := p.StopSignal
	if sig == 0 {
		sig = syscall.SIGTERM
	}
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
	_ = pfd.Signal(syscall.SIGKILL)
	// The group too: children left behind. Only while the leader is the
	// recorded process (its pidfd not yet readable) is the group id its.
	_ = syscall.Kill(-p.PID, syscall.SIGKILL)
	if err := <-done; err != nil && !errors.Is(err, handoff.ErrNotSameProcess) {
		return err
	}
	return nil
}
