package workers

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/deployd/deployd/workers/logs"
)

// watch tells the loop when w, sl's worker, exits. Run by the loop.
func (s *Supervisor) watch(sl *slot, w *Worker) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		<-w.Done()
		s.send(func(st *state) { s.onExit(st, sl, w) })
	}()
}

// onExit handles the exit of sl's worker w: a crash, unless the supervisor
// stopped it. It schedules the restart after the slot's backoff, or errors
// the app after too many crashes. Run by the loop.
func (s *Supervisor) onExit(st *state, sl *slot, w *Worker) {
	if st.closing || sl.cur != w || !st.live(sl) || st.app == AppStopped || st.app == AppStopping {
		return // stopped by the supervisor: the operation reports it
	}
	desc := w.ExitDescription()
	spec := sl.spec
	now := time.Now()
	s.changeStateTo(st, Event{Type: EventCrash, Slot: sl.index, PID: w.PID, Release: w.Release, Message: desc}, func() {
		st.lastExit = fmt.Sprintf("worker %d (pid %d): %s", sl.index, w.PID, desc)
		st.lastLines = w.LastLines()
		sl.crashes = append(sl.crashes, now)
		for len(sl.crashes) > 0 && now.Sub(sl.crashes[0]) > spec.Restart.Window {
			sl.crashes = sl.crashes[1:]
		}
	})
	if s.canaryCrash(st, sl, w, desc) {
		return // the hold's abort replaces the worker
	}
	if len(sl.crashes) > spec.Restart.MaxRestarts {
		s.setApp(st, AppErrored, nil)
		s.log.Error("app errored: too many crashes, not restarting; fix it and run `deployd restart`",
			"crashes", len(sl.crashes), "window", spec.Restart.Window, "last", st.lastExit)
		return
	}
	delay := restartDelay(sl, w, spec.Restart, now)
	s.log.Warn("worker exited, restarting", "worker", sl.index, "pid", w.PID, "status", desc,
		"uptime", roundDuration(now.Sub(w.Started)), "in", roundDuration(delay))
	if delay == 0 {
		s.restartSlot(st, sl, w)
		return
	}
	sl.restartAt = now.Add(delay)
	sl.timer = time.AfterFunc(delay, func() {
		s.send(func(st *state) { s.restartSlot(st, sl, w) })
	})
}

// restartSlot starts a new worker in sl in place of w, which crashed. Run
// by the loop: spawn is a fork and exec, it does not wait for the worker.
// During a handover it waits for Resume: after Release the next agent
// restarts the slot, as the handover told it.
func (s *Supervisor) restartSlot(st *state, sl *slot, w *Worker) {
	if st.handover != nil && !st.closing {
		st.handover.due = append(st.handover.due, func(st *state) { s.restartSlot(st, sl, w) })
		return
	}
	sl.timer = nil
	if st.closing || sl.cur != w || !st.live(sl) ||
		st.app == AppErrored || st.app == AppStopped || st.app == AppStopping {
		return
	}
	spec := sl.spec
	nw, err := spawn(s.args(), spec, sl.index)
	if err != nil {
		s.log.Error("restart failed", "worker", sl.index, "error", err)
		nw = deadWorker(sl.index, spec, err)
	} else {
		s.log.Info("worker restarted", "worker", sl.index, "pid", nw.PID, "release", spec.Release)
	}
	s.changeStateTo(st, Event{Type: EventRestart, Slot: sl.index, PID: nw.PID, Release: spec.Release}, func() {
		sl.cur = nw
		sl.restarts++
		st.ctr.Restarts++
		st.sampleOne(s.fs, nw)
	})
	s.watch(sl, nw)
	s.watchReady(sl, nw)
}

// watchReady publishes the readiness of a restarted worker, which no
// operation waits for.
func (s *Supervisor) watchReady(sl *slot, w *Worker) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		select {
		case <-w.Ready():
		case <-w.Done():
			return
		}
		s.send(func(st *state) {
			if sl.cur == w {
				s.changeStateTo(st, Event{Type: EventReady, Slot: sl.index, PID: w.PID, Release: w.Release,
					Millis: w.ReadyAfter().Milliseconds()}, func() { st.resample(s.fs, w) })
			}
		})
	}()
}

// deadWorker stands for a worker that could not be started, so the crash
// policy counts it like one that exited at once.
func deadWorker(slotIdx int, spec *Spec, err error) *Worker {
	w := &Worker{Slot: slotIdx, Release: spec.Release, Generation: spec.Generation,
		Started: time.Now(), tail: logs.NewTail(1), ready: make(chan struct{}),
		exited: make(chan struct{}), state: Exited, exitErr: err, spec: spec}
	w.tail.Add(err.Error())
	close(w.exited)
	return w
}

// restartDelay is how long sl waits before it restarts w, which crashed at
// now, and advances sl's backoff. An isolated crash (w became ready and
// stayed up StableAfter) restarts at once and resets the backoff, as PM2
// does past min_uptime; a crash loop (w died before that) waits the slot's
// backoff, jittered and capped at MaxBackoff, which then doubles. Run by the loop.
func restartDelay(sl *slot, w *Worker, p RestartPolicy, now time.Time) time.Duration {
	if w.wasReady() && now.Sub(w.Started) >= p.StableAfter {
		sl.backoff = p.Backoff
		return 0
	}
	delay := min(jitter(sl.backoff), p.MaxBackoff)
	sl.backoff = min(sl.backoff*2, p.MaxBackoff)
	return delay
}

// wasReady reports whether w reported ready.
func (w *Worker) wasReady() bool {
	select {
	case <-w.ready:
		return true
	default:
		return false
	}
}

// jitter spreads d by ±20 %.
func jitter(d time.Duration) time.Duration {
	if d <= 0 {
		return 0
	}
	return time.Duration(float64(d) * (0.8 + 0.4*rand.Float64()))
}

// roundDuration rounds d for a log line: to the millisecond below 10 s, else
// to the tenth of a second ("33.2s", not "33.219918522s").
func roundDuration(d time.Duration) time.Duration {
	if d < 10*time.Second {
		return d.Round(time.Millisecond)
	}
	return d.Round(100 * time.Millisecond)
}
