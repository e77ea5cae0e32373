package handoff

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/hashicorp/go-hclog"

	"github.com/deployd/deployd/internal/steer"
)

// needSteering skips where the kernel cannot steer (fails under CI=true).
func needSteering(t *testing.T) {
	t.Helper()
	if err := steer.Available(); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("CI=true and kernel steering is unavailable: %v", err)
		}
		t.Skipf("kernel steering unavailable: %v", err)
	}
}

func steeredWant(addr, balance string) Want {
	w := want(addr)
	w.Balance = balance
	return w
}

// member opens a worker socket of l in slot and returns a listener on it.
func member(t *testing.T, l *Listener, slot int) net.Listener {
	t.Helper()
	m, err := l.Member()
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	fd, _ := m.Fd()
	if err := l.Steered().Group.Set(slot, fd); err != nil {
		t.Fatal(err)
	}
	ln, err := net.FileListener(m.file)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

func TestSteeredListenerGivesEachWorkerASocket(t *testing.T) {
	needSteering(t)
	store := newFakeStore()
	r := NewRegistry(store, nil, nil)
	defer r.Close()
	lease, err := r.Acquire("web", []Want{steeredWant("127.0.0.1:0", BalanceSticky)})
	if err != nil {
		t.Fatal(err)
	}
	defer lease.Release()
	l := lease.Bound()[0].Listener
	if got := l.Balance(); got != "sticky" {
		t.Fatalf("Balance() = %q, want sticky", got)
	}
	addr, err := l.LocalAddr()
	if err != nil {
		t.Fatal(err)
	}
	if listening(addr) {
		t.Fatalf("the anchor at %s accepts connections: it must only hold the address", addr)
	}
	ln := member(t, l, 0)
	if err := l.Steered().Group.SetActive(1); err != nil {
		t.Fatal(err)
	}
	checkServed(t, ln, addr)
	if store.added[Key("tcp", "127.0.0.1:0")] == nil || store.added[steerKey(Key("tcp", "127.0.0.1:0"))] == nil {
		t.Errorf("the anchor and the program are not kept for a handoff: %v", store.added)
	}

	// A second lease asking even switches the mode of the same group.
	lease2, err := r.Acquire("web", []Want{steeredWant("127.0.0.1:0", BalanceEven)})
	if err != nil {
		t.Fatal(err)
	}
	defer lease2.Release()
	if got := l.Balance(); got != "even" {
		t.Errorf("after a lease asking even, Balance() = %q", got)
	}
}

// checkServed dials addr and checks ln accepts that very connection.
func checkServed(t *testing.T, ln net.Listener, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ln.(*net.TCPListener).SetDeadline(time.Now().Add(5 * time.Second))
	a, err := ln.Accept()
	if err != nil {
		t.Fatalf("the slot's socket got no connection: %v", err)
	}
	a.Close()
}

func TestSteeredListenerCrossesAHandoff(t *testing.T) {
	needSteering(t)
	old := newFakeStore()
	r1 := NewRegistry(old, nil, nil)
	lease, err := r1.Acquire("web", []Want{steeredWant("127.0.0.1:0", BalanceEven)})
	if err != nil {
		t.Fatal(err)
	}
	l1 := lease.Bound()[0].Listener
	addr, _ := l1.LocalAddr()
	ln := member(t, l1, 0) // a worker of the previous agent
	if err := l1.Steered().Group.SetActive(1); err != nil {
		t.Fatal(err)
	}

	next := newFakeStore()
	for k, f := range old.added {
		next.files[k] = f
	}
	r2 := NewRegistry(next, nil, nil)
	defer r2.Close()
	lease2, err := r2.Acquire("web", []Want{steeredWant("127.0.0.1:0", BalanceEven)})
	if err != nil {
		t.Fatal(err)
	}
	defer lease2.Release()
	l2 := lease2.Bound()[0].Listener
	if !l2.Inherited || l2.Steered() == nil {
		t.Fatalf("inherited %v, steered %v: the next agent must take the group over", l2.Inherited, l2.Steered())
	}
	ln2 := member(t, l2, 1) // a worker of the next agent, through the same map
	if err := l2.Steered().Group.SetActive(2); err != nil {
		t.Fatal(err)
	}
	if err := l2.Steered().Group.Clear(0); err != nil {
		t.Fatal(err)
	}
	checkServed(t, ln2, addr)
	ln.Close()
}

// steerFallbackReport is what the steer-fallback helper saw.
type steerFallbackReport struct {
	Balance string
	Served  bool
	Err     string
}

// helperSteerFallback drops root, then leases a listener asking even.
func helperSteerFallback() int {
	if err := syscall.Setresuid(65534, 65534, 65534); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	log := hclog.New(&hclog.LoggerOptions{Output: os.Stderr, Level: hclog.Warn})
	r := NewRegistry(nil, nil, log)
	defer r.Close()
	var rep steerFallbackReport
	lease, err := r.Acquire("web", []Want{steeredWant("127.0.0.1:0", BalanceEven)})
	if err != nil {
		rep.Err = err.Error()
	} else {
		l := lease.Bound()[0].Listener
		rep.Balance = l.Balance()
		addr, _ := l.LocalAddr()
		rep.Served = listening(addr)
	}
	json.NewEncoder(os.Stdout).Encode(rep)
	return 0
}

func TestSteeringFallsBackToSharedWithoutPrivilege(t *testing.T) {
	if os.Getuid() != 0 {
		t.Skip("needs root to drop it")
	}
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=steer-fallback", noRaceExitSleep)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("helper: %v\n%s", err, errb.String())
	}
	var rep steerFallbackReport
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("helper said %q: %v\n%s", out.String(), err, errb.String())
	}
	if rep.Err != "" || rep.Balance != BalanceShared || !rep.Served {
		t.Fatalf("without privilege: %+v; want a shared listener that serves", rep)
	}
	if log := errb.String(); !strings.Contains(log, "balance falls back to shared") || !strings.Contains(log, "CAP_BPF") {
		t.Errorf("the log must say it fell back and what is missing:\n%s", log)
	}
}
