package cli

import (
	"bytes"
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/api"
)

// The text status shows why an app is down: an errored app's last exit
// and output, and, while a crashed worker waits for its restart, the last
// exit status and the last output line.
func TestStatusShowsLastExit(t *testing.T) {
	for _, tc := range []struct {
		name, state, worker string
		want, not           []string
	}{
		{"exited", "running", "exited",
			[]string{"web: last exit: worker 0 (pid 42): exit status 3", "  | cannot load config: boom"},
			[]string{"first line"}},
		{"errored", "errored", "exited",
			[]string{"web is errored", "last exit: worker 0 (pid 42): exit status 3", "  | first line", "  | cannot load config: boom"}, nil},
		{"restarting", "running", "starting",
			[]string{"web: last exit: worker 0 (pid 42): exit status 3", "  | cannot load config: boom"}, nil},
		{"serving again", "running", "ready", nil, []string{"last exit"}},
	} {
		st := &api.Status{Apps: []api.App{{Name: "web", State: tc.state, LastExit: "worker 0 (pid 42): exit status 3",
			LastLines: []string{"first line", "cannot load config: boom"},
			Workers:   []api.Worker{{Slot: 0, PID: 42, State: tc.worker, Restarts: 1}}}}}
		var b bytes.Buffer
		printStatus(&b, st)
		for _, w := range tc.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%s: status lacks %q:\n%s", tc.name, w, b.String())
			}
		}
		for _, w := range tc.not {
			if strings.Contains(b.String(), w) {
				t.Errorf("%s: status shows %q:\n%s", tc.name, w, b.String())
			}
		}
	}
}

// An accept-queue warning shows under the table.
func TestStatusShowsQueueWarning(t *testing.T) {
	st := &api.Status{Apps: []api.App{{Name: "web", State: "running",
		Warnings: []string{"tcp 127.0.0.1:8080: 12 connections wait in the accept queue"}}}}
	var b bytes.Buffer
	printStatus(&b, st)
	if !strings.Contains(b.String(), "web: warning: listener tcp 127.0.0.1:8080: 12 connections wait") {
		t.Errorf("status lacks the warning:\n%s", b.String())
	}
}

// Old workers draining in the background follow their app's workers, with
// their pid and state, and the connections each still holds ("unknown"
// where the agent could not count them).
func TestStatusShowsDrainingWorkers(t *testing.T) {
	three := 3
	st := &api.Status{Apps: []api.App{{Name: "web", State: "running", Release: "v2",
		Workers: []api.Worker{{Slot: 0, PID: 50, State: "ready", Release: "v2", Generation: 2}},
		Draining: []api.Worker{{Slot: 0, PID: 40, State: "draining", Release: "v1", Generation: 1, Connections: &three},
			{Slot: 1, PID: 41, State: "draining", Release: "v1", Generation: 1}}}}}
	var b bytes.Buffer
	printStatus(&b, st)
	lines := strings.Split(b.String(), "\n")
	var ready, draining int
	for i, l := range lines {
		f := strings.Fields(l)
		switch {
		case len(f) > 4 && f[2] == "50" && f[3] == "ready":
			ready = i
		case len(f) > 4 && f[2] == "40" && f[3] == "draining" && f[4] == "v1":
			draining = i
		}
	}
	if ready == 0 || draining <= ready {
		t.Errorf("status does not show pid 40 draining after the ready worker:\n%s", b.String())
	}
	for _, want := range []string{"web[0] pid 40 draining: 3 open connections\n",
		"web[1] pid 41 draining: open connections unknown (the agent may not read /proc/41/fd; run it as root)\n"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
}

// A steered app lists each worker's new connections and accept queue (a
// spare has no count; unknown figures say so, never 0) and its listeners'
// queues; a shared app shows a listener's queue only while connections wait.
func TestStatusShowsAcceptQueues(t *testing.T) {
	n, zero, five := uint64(7), 0, 5
	st := &api.Status{Apps: []api.App{
		{Name: "web", State: "running", Balance: "even", Spares: 1,
			AcceptQueues: []api.AcceptQueue{{Listen: "tcp 127.0.0.1:8080", Queued: 5, Backlog: 8192}},
			Workers: []api.Worker{{Slot: 0, PID: 40, State: "ready", NewConnections: &n, Queued: &five},
				{Slot: 1, PID: 41, State: "ready", Spare: true, Queued: &zero},
				{Slot: 2, PID: 42, State: "ready"}}},
		{Name: "api", State: "running", Balance: "shared",
			AcceptQueues: []api.AcceptQueue{{Listen: "tcp 127.0.0.1:9090", Queued: 3, Backlog: 4096}}},
		{Name: "idle", State: "running", Balance: "shared",
			AcceptQueues: []api.AcceptQueue{{Listen: "tcp 127.0.0.1:9091", Queued: 0, Backlog: 4096}}},
	}}
	var b bytes.Buffer
	printStatus(&b, st)
	for _, w := range []string{
		"  web[0] pid 40: 7 new connections, 5 queued\n",
		"  web[1] pid 41: spare, 0 queued\n",
		"  web[2] pid 42: new connections unknown, accept queue unknown\n",
		"  listener tcp 127.0.0.1:8080: 5 queued (backlog 8192)\n",
		"api: 3 connections wait in the accept queue of tcp 127.0.0.1:9090 (backlog 4096)\n",
	} {
		if !strings.Contains(b.String(), w) {
			t.Errorf("status lacks %q:\n%s", w, b.String())
		}
	}
	if strings.Contains(b.String(), "9091") {
		t.Errorf("status shows an empty shared queue:\n%s", b.String())
	}
}
