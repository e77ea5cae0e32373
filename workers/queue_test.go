package workers

import (
	"net"
	"strings"
	"testing"
	"time"
)

// A listener whose accept queue keeps growing while the app's worker (the
// serve-ready helper never accepts) takes nothing from it is warned about
// in Status.
func TestStatusWarnsOfGrowingAcceptQueue(t *testing.T) {
	t.Parallel()
	l := newListener(t)
	s := newSupervisor(t, testSpec(t, l, "serve-ready", 1))
	mustStart(t, s)
	if w := s.Status().Warnings; len(w) != 0 {
		t.Fatalf("warnings before any connection: %q", w)
	}
	addr, err := l.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	dialed := make(chan []net.Conn)
	go func() { // a client arriving every 100 ms
		var cs []net.Conn
		defer func() { dialed <- cs }()
		for {
			if c, err := net.Dial("tcp", addr); err == nil {
				cs = append(cs, c)
			}
			select {
			case <-stop:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	}()
	defer func() {
		close(stop)
		for _, c := range <-dialed {
			c.Close()
		}
	}()
	deadline := time.Now().Add(time.Duration(queueTicks+5) * sampleInterval)
	for {
		w := s.Status().Warnings
		if len(w) == 1 && strings.Contains(w[0], l.Address) && strings.Contains(w[0], "no worker accepts") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no accept-queue warning after %s: %q", time.Duration(queueTicks+5)*sampleInterval, w)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
