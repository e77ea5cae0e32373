package agent

import (
	"os"
	"os/signal"
	"sync"
	"syscall"

	"github.com/deployd/deployd/internal/failpoint"
)

// watchSignals delivers SIGTERM, SIGINT, SIGHUP and SIGUSR1 on the channel
// it returns until stop is called (once, by Run). Under the stress knob
// failpoint.EnvSignalDelay each signal is held a random time first, in
// order, by a relay that stop ends and waits for.
func watchSignals() (sigs <-chan os.Signal, stop func()) {
	raw := make(chan os.Signal, 4)
	signal.Notify(raw, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGUSR1)
	if failpoint.SignalDelay() == 0 {
		return raw, func() { signal.Stop(raw) }
	}
	out, done := make(chan os.Signal, 4), make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			select {
			case sig := <-raw:
				failpoint.DelaySignal()
				select {
				case out <- sig:
				case <-done:
					return
				}
			case <-done:
				return
			}
		}
	})
	return out, func() {
		signal.Stop(raw)
		close(done)
		wg.Wait()
	}
}
