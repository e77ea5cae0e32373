// Command bench measures deployd against PM2 cluster mode and against bare processes on
// this machine, in one run, and prints the results as Markdown (see BENCHMARKS.md):
//
//	go run ./integration/bench [-quick] [-repeats N] [-duration D] [-out FILE]
//
// It builds deployd and the Go test app, installs pm2 from the npm registry into a
// temporary folder when node and npm exist (PM2_HOME is temporary too: the user's ~/.pm2
// is never touched), and measures throughput and latency, reloads under load, the
// manager's own CPU and memory, and crash recovery — alternating the systems within
// each repeat. Every load is on 127.0.0.1 and bounded in time and requests; every
// process it starts is stopped before it exits, on error and on Ctrl-C too.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/deployd/deployd/integration"
)

// bench holds a run's settings, binaries and results.
type bench struct {
	dir                     string // temporary folder for everything of the run
	deployd, testapp        string
	node, appJS             string
	pm2, pm2Prefix, pm2Skip string // pm2 == "": PM2 rows skipped, pm2Skip says why
	pm2Version, nodeVersion string

	instances, repeats, slowRepeats, reloads      int
	clients, freshClients                         int
	duration, slice, warmup, slowStart, quietWait time.Duration
	quietBusy                                     float64
	loadCPUs                                      []int

	started          time.Time
	machine, command string
	res              results

	mu       sync.Mutex
	pm2Homes []string // owned by mu: every PM2_HOME used, for the final pm2 kill
}

func main() {
	if spec := os.Getenv(loadEnv); spec != "" {
		os.Exit(runLoadChild(spec))
	}
	os.Exit(run())
}

// options are the flags that are not part of the bench itself.
type options struct {
	deploydBin, pm2Prefix, out string
	noPM2, keep                bool
	phases                     []string
}

// parseFlags reads the command line; a non-zero code means exit with it.
func parseFlags() (*bench, options, int) {
	quick := flag.Bool("quick", false, "a short run for development: 1 repeat, 2s loads, 2 reloads per run")
	repeats := flag.Int("repeats", 3, "repeats of every measurement (systems alternate within each)")
	duration := flag.Duration("duration", 5*time.Second, "load per system and endpoint in each repeat of the throughput runs")
	sliceLen := flag.Duration("slice", time.Second, "the throughput load alternates between the systems in slices this long")
	warmup := flag.Duration("warmup", 2*time.Second, "warm-up load per system and endpoint before the throughput slices")
	reloads := flag.Int("reloads", 5, "reloads per reload run")
	clients := flag.Int("clients", 32, "keep-alive clients of the load generator")
	fresh := flag.Int("fresh-clients", 4, "clients opening a new connection per request, during reloads")
	instances := flag.Int("instances", runtime.NumCPU(), "workers per app (default: one per core)")
	slowStart := flag.Duration("slow-start", 4*time.Second, "startup time of the slow app in the reload runs")
	slowRepeats := flag.Int("slow-repeats", 2, "repeats of the reload runs with the slow app (each takes ~2 min)")
	loadCPUs := flag.String("loadgen-cpus", "", "pin the load generator to these CPUs, e.g. \"1\" (default: not pinned)")
	quietWait := flag.Duration("quiet-wait", 15*time.Second,
		"before each measurement, wait up to this long until other jobs use less than -quiet-busy CPU (0: don't)")
	quietBusy := flag.Float64("quiet-busy", 25, "CPU % (of one core) the rest of the machine may use for it to count as quiet")
	var o options
	flag.StringVar(&o.pm2Prefix, "pm2-prefix", "", "use pm2 already installed under this npm prefix instead of installing it")
	flag.StringVar(&o.deploydBin, "deployd", "", "use this deployd binary instead of building ./cmd/deployd")
	flag.BoolVar(&o.noPM2, "no-pm2", false, "skip the PM2 rows")
	only := flag.String("only", "throughput,crash,crashloop,memory,reload", "phases to run, comma-separated (also: upgrade, kill, spares)")
	flag.StringVar(&o.out, "out", "", "also write the Markdown report to this file")
	flag.BoolVar(&o.keep, "keep", false, "keep the temporary folder (logs) at the end")
	flag.Parse()
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick {
		for name, v := range map[string]string{"repeats": "1", "duration": "2s", "warmup": "500ms", "reloads": "2",
			"quiet-wait": "0", "slow-repeats": "1"} {
			if !set[name] {
				_ = flag.Set(name, v)
			}
		}
	}
	b := &bench{instances: *instances, repeats: *repeats, slowRepeats: min(*slowRepeats, *repeats), reloads: *reloads,
		clients: *clients, freshClients: *fresh, duration: *duration, slice: *sliceLen, warmup: *warmup,
		slowStart: *slowStart, quietWait: *quietWait, quietBusy: *quietBusy, started: time.Now(),
		command: strings.TrimSpace("go run ./integration/bench " + strings.Join(os.Args[1:], " "))}
	for _, c := range strings.Split(*loadCPUs, ",") {
		if c = strings.TrimSpace(c); c != "" {
			n, err := strconv.Atoi(c)
			if err != nil {
				fmt.Fprintf(os.Stderr, "bench: -loadgen-cpus %q: %v\n", *loadCPUs, err)
				return nil, o, 2
			}
			b.loadCPUs = append(b.loadCPUs, n)
		}
	}
	for _, p := range strings.Split(*only, ",") {
		p = strings.TrimSpace(p)
		if p != "throughput" && p != "crash" && p != "crashloop" && p != "reload" && p != "upgrade" && p != "memory" && p != "kill" && p != "spares" {
			fmt.Fprintf(os.Stderr, "bench: -only: unknown phase %q (throughput, crash, crashloop, reload, memory, upgrade, kill, spares)\n", p)
			return nil, o, 2
		}
		o.phases = append(o.phases, p)
	}
	return b, o, 0
}

func run() int {
	b, o, code := parseFlags()
	if code != 0 {
		return code
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	dir, err := os.MkdirTemp("", "deployd-bench-")
	if err != nil {
		fmt.Fprintf(os.Stderr, "bench: %v\n", err)
		return 1
	}
	b.dir = dir
	defer func() {
		b.cleanup()
		if o.keep {
			fmt.Fprintf(os.Stderr, "bench: logs kept in %s\n", dir)
		} else {
			os.RemoveAll(dir)
		}
	}()
	if err := b.setup(ctx, o.deploydBin, o.pm2Prefix, o.noPM2); err != nil {
		fmt.Fprintf(os.Stderr, "bench: setup: %v\n", err)
		return 1
	}
	phases := map[string]func(context.Context) error{
		"throughput": b.throughput, "crash": b.crashRecovery, "crashloop": b.crashLoop, "reload": b.reloadsUnderLoad,
		"memory":  b.memory,
		"upgrade": b.upgradesUnderLoad,
		"kill":    b.managerKillsUnderLoad,
		"spares":  b.sparesRecovery,
	}
	var runErr error
	for _, name := range o.phases {
		if runErr = phases[name](ctx); runErr != nil {
			break
		}
	}
	if runErr != nil {
		fmt.Fprintf(os.Stderr, "bench: %v (logs in %s)\n", runErr, dir)
		o.keep = true
		if ctx.Err() != nil {
			return 130
		}
	}
	w := io.Writer(os.Stdout)
	if o.out != "" {
		f, err := os.Create(o.out)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bench: %v\n", err)
			return 1
		}
		defer f.Close()
		w = io.MultiWriter(os.Stdout, f)
	}
	b.report(w)
	if runErr != nil {
		return 1
	}
	return 0
}

// setup builds the binaries, finds node and installs pm2.
func (b *bench) setup(ctx context.Context, deploydBin, pm2Prefix string, noPM2 bool) error {
	b.machine = machine()
	b.logf("building deployd and the test app into %s", b.dir)
	var e1, e2 error
	var wg sync.WaitGroup
	if deploydBin != "" {
		b.deployd, e1 = filepath.Abs(deploydBin)
	} else {
		wg.Go(func() { b.deployd, e1 = integration.Build(b.dir, "deployd", "./cmd/deployd", "bench") })
	}
	wg.Go(func() { b.testapp, e2 = integration.Build(b.dir, "testapp", "./integration/testapp", "") })
	wg.Wait()
	if err := errors.Join(e1, e2); err != nil {
		return err
	}
	b.appJS = filepath.Join(integration.RepoRoot(), "integration", "bench", "nodeapp", "app.js")
	node, err := exec.LookPath("node")
	if err != nil {
		return fmt.Errorf("node not found: the Node app is what is measured: %w", err)
	}
	b.node = node
	if v, err := exec.Command(node, "--version").Output(); err == nil {
		b.nodeVersion = strings.TrimSpace(string(v))
	}
	npm, npmErr := exec.LookPath("npm")
	switch {
	case noPM2:
		b.pm2Skip = "-no-pm2 given"
	case pm2Prefix != "":
		b.pm2Prefix = pm2Prefix
		b.pm2, b.pm2Version, err = pm2At(pm2Prefix)
	case npmErr != nil:
		b.pm2Skip = "npm not found"
	default:
		b.pm2Prefix = filepath.Join(b.dir, "pm2")
		b.logf("installing pm2 from the npm registry into %s", b.pm2Prefix)
		b.pm2, b.pm2Version, err = installPM2(ctx, npm, b.pm2Prefix)
	}
	if err != nil {
		return err
	}
	if b.pm2 == "" {
		b.logf("PM2 ROWS SKIPPED: %s", b.pm2Skip)
	}
	b.machine += fmt.Sprintf(", Node %s", b.nodeVersion)
	if b.pm2 != "" {
		b.machine += fmt.Sprintf(", pm2 %s", b.pm2Version)
	}
	b.machine += ", Go " + runtime.Version()
	return nil
}

// machine describes the host: cores, CPU model, kernel, memory.
func machine() string {
	model := "unknown CPU"
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if k, v, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	kernel, _ := os.ReadFile("/proc/sys/kernel/osrelease")
	mem := ""
	if f, err := os.Open("/proc/meminfo"); err == nil {
		if n, err := parseKB(f, "MemTotal:"); err == nil {
			mem = fmt.Sprintf(", %.1f GiB RAM", float64(n)/(1<<20))
		}
		f.Close()
	}
	return fmt.Sprintf("%d cores (nproc), %s, Linux %s%s", runtime.NumCPU(), model, strings.TrimSpace(string(kernel)), mem)
}

func parseKB(r io.Reader, key string) (int64, error) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), key); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				return strconv.ParseInt(f[0], 10, 64)
			}
		}
	}
	return 0, fmt.Errorf("no %s", key)
}

func (b *bench) loadWhere() string {
	if len(b.loadCPUs) == 0 {
		return "integration/loadgen (Go, HDR histogram, every response checked) in a child process of the harness, " +
			"not pinned: it shares the cores with the servers and needs about one of them at hello rates"
	}
	return fmt.Sprintf("integration/loadgen in a child process pinned to CPU %v (servers are not pinned)", b.loadCPUs)
}

func (b *bench) logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}

func (b *bench) addPM2Home(home string) {
	b.mu.Lock()
	b.pm2Homes = append(b.pm2Homes, home)
	b.mu.Unlock()
}

// cleanup makes sure nothing the run started is left: pm2 kill for every PM2_HOME, then
// every process still registered or tracked.
func (b *bench) cleanup() {
	b.mu.Lock()
	homes := b.pm2Homes
	b.pm2Homes = nil
	b.mu.Unlock()
	for _, home := range homes {
		pidb, err := os.ReadFile(filepath.Join(home, "pm2.pid"))
		if err != nil {
			continue // no daemon (any more)
		}
		if pid, err := strconv.Atoi(strings.TrimSpace(string(pidb))); err == nil && alive(pid) {
			if out, err := runPM2(context.Background(), b.pm2, home, 60*time.Second, "kill"); err != nil {
				b.logf("cleanup: pm2 kill (%s): %v\n%s", home, err, out)
			}
		}
	}
	if left := cleanupAll(); len(left) > 0 {
		b.logf("cleanup: stopped what was left: %s", strings.Join(left, ", "))
	}
}
