package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"
)

// config holds the flags; see parseConfig for their meaning.
type config struct {
	version         string
	listen          string
	startupDelay    time.Duration
	readyFile       string
	exitBeforeReady int
	neverReady      bool
	neverReadySlot  string
	crashAfter      time.Duration
	crashCode       int
	ignoreSIGTERM   bool
	logSpam         int
	slow            time.Duration
	ready           string
	notifyFromChild bool
	abruptSIGTERM   bool
	stopDelay       time.Duration
	tick            time.Duration
	healthAfter     time.Duration
	daemonDir       string
	daemonNoTERM    bool
}

// envPrefix names the environment variables that set flags: TESTAPP_STARTUP_DELAY=2s is
// -startup-delay 2s. A test sets them through the env table of deployd's config; a flag on
// the command line wins over the variable.
const envPrefix = "TESTAPP_"

func parseConfig(args []string, getenv func(string) string) (config, error) {
	var c config
	fs := flag.NewFlagSet("testapp", flag.ContinueOnError)
	fs.StringVar(&c.version, "version", "v1", "version reported in every response")
	fs.StringVar(&c.listen, "listen", "", "`ADDR` to listen on when no socket is passed (LISTEN_FDS)")
	fs.DurationVar(&c.startupDelay, "startup-delay", 0, "sleep this long before serving and getting ready")
	fs.StringVar(&c.readyFile, "ready-file", "", "after the startup delay, wait until `PATH` exists before serving and getting ready")
	fs.IntVar(&c.exitBeforeReady, "exit-before-ready", -1, "exit with this code instead of getting ready (-1: off)")
	fs.BoolVar(&c.neverReady, "never-ready", false, "serve but never signal readiness")
	fs.StringVar(&c.neverReadySlot, "never-ready-slot", "", "-never-ready in the worker of slot `N` (DEPLOYD_WORKER) only")
	fs.DurationVar(&c.crashAfter, "crash-after", 0, "exit this long after getting ready (code -crash-code)")
	fs.IntVar(&c.crashCode, "crash-code", exitFailure, "exit code of -crash-after (0: a release that ends right after its ready line)")
	fs.BoolVar(&c.ignoreSIGTERM, "ignore-sigterm", false, "ignore SIGTERM (SIGINT still stops)")
	fs.IntVar(&c.logSpam, "log-spam", 0, "after ready, write this many lines \"line <slot> <pid> <i>\" to stdout")
	fs.DurationVar(&c.slow, "slow", 0, "add this much latency to every request")
	fs.StringVar(&c.ready, "ready", "notify", "how to signal readiness: notify, node-ipc, log or delay")
	fs.BoolVar(&c.abruptSIGTERM, "abrupt-sigterm", false, "on SIGTERM exit at once, cutting open connections (no drain)")
	fs.DurationVar(&c.stopDelay, "stop-delay", 0, "on SIGTERM, keep serving (and accepting) this long before the drain: a worker slow to handle its stop signal")
	fs.DurationVar(&c.tick, "tick", 0, "after ready, write \"tick <slot> <pid> <n>\" (n = 1, 2, ...) to stdout this often")
	fs.DurationVar(&c.healthAfter, "health-after", 0, "GET /healthz answers 503 until this long after the app serves (it serves / at once)")
	fs.BoolVar(&c.notifyFromChild, "notify-from-child", false, "send READY=1 from a child process (-ready notify)")
	fs.StringVar(&c.daemonDir, "daemon-dir", "", "before serving, start a daemon (setsid) that keeps the inherited listener (fd 3) and stdout, "+
		"serves \"version=<version>-daemon\" on it for ever, and writes its pid to a file named after it in `DIR`")
	fs.BoolVar(&c.daemonNoTERM, "daemon-ignore-sigterm", false, "the -daemon-dir daemon ignores SIGTERM (it holds the listener until killed)")

	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage of testapp (each flag also from %sNAME, e.g. %sSTARTUP_DELAY=2s):\n", envPrefix, envPrefix)
		fs.PrintDefaults()
	}

	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		name := envPrefix + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(name); v != "" && envErr == nil {
			if err := fs.Set(f.Name, v); err != nil {
				envErr = fmt.Errorf("%s=%q: %w", name, v, err)
			}
		}
	})
	if envErr != nil {
		return c, envErr
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	switch {
	case fs.NArg() > 0:
		return c, fmt.Errorf("unexpected argument %q", fs.Arg(0))
	case c.ready != "notify" && c.ready != "node-ipc" && c.ready != "log" && c.ready != "delay":
		return c, fmt.Errorf("-ready %q: want notify, node-ipc, log or delay", c.ready)
	case c.notifyFromChild && c.ready != "notify":
		return c, errors.New("-notify-from-child needs -ready notify")
	case c.logSpam < 0:
		return c, errors.New("-log-spam must not be negative")
	}
	return c, nil
}
