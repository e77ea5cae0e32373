package workers

import (
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

func init() {
	// notify-listen sends LISTEN= over NOTIFY_SOCKET, as any process of a
	// worker can, claiming an address the app's code never asked for.
	helpers["notify-listen"] = func() int {
		if err := sdNotify("LISTEN=tcp://127.0.0.1:1\nSTATUS=claimed a listen"); err != nil {
			return 5
		}
		return 0
	}
}

// A LISTEN= that a child of the app sends over NOTIFY_SOCKET claims
// nothing: the address is the one the app's own bind asks for, and this
// app, which never listens, is named as one that did not.
func TestLearnIgnoresListenOverNotifySocket(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js := "const r = require('child_process').spawnSync(" + strconv.Quote(self) + ", [], {stdio: 'inherit', env: " +
		"Object.assign({}, process.env, {" + helperEnv + ": 'notify-listen', " + strconv.Quote(noRaceExitSleep[:6]) +
		": 'atexit_sleep_ms=0'})});\nconsole.log('helper exited ' + r.status);\nsetInterval(() => {}, 1000);\n"
	p := &learnPolicy{}
	spec := nodeLearnSpec(t, js, p)
	spec.ReadyTimeout = 2 * time.Second
	s := newSupervisor(t, spec)
	err = s.Start()
	if err == nil || !strings.Contains(err.Error(), "never listened on a TCP port") {
		t.Fatalf("Start = %v; want the app named as one that never listened: LISTEN= on NOTIFY_SOCKET must not count", err)
	}
	if rs := p.requests(); len(rs) != 0 {
		t.Errorf("the policy was asked %v; want nothing", rs)
	}
	// The helper ran and sent it (its exit status is in the app's output).
	if lines := strings.Join(notReadyLines(t, err), "\n"); !strings.Contains(lines, "helper exited 0") {
		t.Errorf("the app's output %q does not say the helper sent LISTEN= (exit 0)", lines)
	}
}
