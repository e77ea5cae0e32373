package control

import (
	"strings"
	"testing"

	"github.com/deployd/deployd/agent"
	"github.com/deployd/deployd/agent/api"
)

// A steered app's scrape has its balance (in effect and asked), spares,
// each listener's queue and backlog, and each worker's queue and new
// connections where status has them: a figure status lacks (a spare's
// count, a queue not known) is absent, never 0.
func TestMetricsBalanceAndQueues(t *testing.T) {
	n, zero, five := uint64(7), 0, 5
	f := agent.AppFigures{BalanceAsked: "sticky", Status: api.App{Name: "web", State: "running", Balance: "shared", Spares: 1,
		AcceptQueues: []api.AcceptQueue{{Listen: "tcp 127.0.0.1:8080", Queued: 5, Backlog: 8192}},
		Workers: []api.Worker{{Slot: 0, PID: 1 << 30, State: "ready", NewConnections: &n, Queued: &five},
			{Slot: 1, PID: 1<<30 + 1, State: "ready", Spare: true, Queued: &zero},
			{Slot: 2, PID: 1<<30 + 2, State: "starting", Spare: true}}}}
	e := &exposition{}
	for _, fam := range families {
		e.declare(fam[0], fam[1], fam[2])
	}
	(&collector{}).collectApp(e, f)
	out := string(e.Bytes())
	for _, want := range []string{
		`deployd_app_balance_info{app="web",balance="shared",asked="sticky"} 1` + "\n",
		`deployd_app_spares{app="web"} 1` + "\n",
		`deployd_app_spares_ready{app="web"} 1` + "\n",
		`deployd_listener_accept_queue{app="web",listen="tcp 127.0.0.1:8080"} 5` + "\n",
		`deployd_listener_accept_backlog{app="web",listen="tcp 127.0.0.1:8080"} 8192` + "\n",
		`deployd_worker_new_connections_total{app="web",slot="0",pid="1073741824"} 7` + "\n",
		`deployd_worker_accept_queue{app="web",slot="0",pid="1073741824"} 5` + "\n",
		`deployd_worker_accept_queue{app="web",slot="1",pid="1073741825"} 0` + "\n",
		"# TYPE deployd_worker_new_connections_total counter\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	for _, not := range []string{`new_connections_total{app="web",slot="1"`, `new_connections_total{app="web",slot="2"`,
		`accept_queue{app="web",slot="2"`} {
		if strings.Contains(out, not) {
			t.Errorf("scrape has %q, which status does not know", not)
		}
	}
	if t.Failed() {
		t.Log(out)
	}
}
