package workers

import (
	"errors"
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

// LISTEN= is taken from the preload's own channel only: one that a child
// of a discovery run sends over NOTIFY_SOCKET is ignored, and the app,
// which never listens, is named as one that did not.
func TestDiscoverIgnoresListenOverNotifySocket(t *testing.T) {
	t.Parallel()
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	js := "const r = require('child_process').spawnSync(" + strconv.Quote(self) + ", [], {stdio: 'inherit', env: " +
		"Object.assign({}, process.env, {" + helperEnv + ": 'notify-listen', " + strconv.Quote(noRaceExitSleep[:6]) +
		": 'atexit_sleep_ms=0'})});\nconsole.log('helper exited ' + r.status);\nsetInterval(() => {}, 1000);\n"
	spec := nodeDiscoverSpec(t, js)
	spec.ReadyTimeout = 2 * time.Second
	s := newSupervisor(t, spec)
	got, err := s.Discover(spec)
	if !errors.Is(err, ErrNoListen) {
		t.Fatalf("Discover = %q, %v; want ErrNoListen: LISTEN= on NOTIFY_SOCKET must not count", got, err)
	}
	// The helper ran and sent it (its exit status is in the app's output).
	if !strings.Contains(err.Error(), "helper exited 0") {
		t.Errorf("Discover = %v; want the app's output to say the helper sent LISTEN= (exit 0)", err)
	}
}
