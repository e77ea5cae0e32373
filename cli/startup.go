package cli

import (
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/atomicfile"
	"github.com/deployd/deployd/internal/version"
)

func startupCommand() *cli.Command {
	return &cli.Command{
		Name:  "startup",
		Usage: "start the agent at boot under an init system",
		Subcommands: []*cli.Command{{
			Name:  "systemd",
			Usage: "write a systemd unit for the agent (and, with --socket-unit, socket units for the app listeners)",
			Description: "Writes NAME.service into --unit-dir: Type=notify (the agent sends READY=1 once its\n" +
				"workers are ready, STATUS= while it runs, STOPPING=1 when it stops), ExecReload sends\n" +
				"SIGHUP (the agent hands every socket to a new agent; NotifyAccess=all lets that new\n" +
				"agent report its pid with MAINPID=), KillMode=process so that a stop reaches the\n" +
				"agent alone and it drains its workers, and a dead agent's workers keep serving until\n" +
				"Restart= brings the next agent, which adopts them, Delegate=yes (each worker and hook\n" +
				"runs in a cgroup of its own under the unit's), and TimeoutStopSec/TimeoutStartSec that cover the\n" +
				"apps' stop_timeout and ready_timeout.\n" +
				"With --socket-unit it also writes one NAME-APP[-FDNAME].socket per app (and listen\n" +
				"#name) holding that app's tcp and unix listen addresses: systemd keeps them open while\n" +
				"the agent restarts or crashes, so connections wait in the queue instead of being\n" +
				"refused. The agent adopts each socket for the listen URL of the same address (or\n" +
				"FileDescriptorName=). Run it again after you change listen addresses, stop_timeout\n" +
				"or ready_timeout.\n\n" +
				"Example: sudo deployd startup systemd -c /etc/deployd/deployd.toml --socket-unit",
			Flags: []cli.Flag{configFlag,
				&cli.BoolFlag{Name: "print", Usage: "print the units instead of writing them"},
				&cli.BoolFlag{Name: "socket-unit", Usage: "also write socket units holding the app listeners"},
				&cli.StringFlag{Name: "unit-dir", Value: "/etc/systemd/system", Usage: "write the units into `DIR`"},
				&cli.StringFlag{Name: "name", Value: "deployd", Usage: "unit `NAME` (NAME.service)"},
			},
			Action: startupSystemd,
		}},
	}
}

func startupSystemd(c *cli.Context) error {
	if c.NArg() > 0 {
		return fail(ExitUsage, "usage: deployd startup systemd [--print] [--socket-unit] [-c FILE] [--unit-dir DIR] [--name NAME]")
	}
	name := c.String("name")
	if !validUnitPrefix(name) {
		return fail(ExitUsage, "--name %q: use letters, digits, '-', '_' and '.' only", name)
	}
	path, err := filepath.Abs(config.Find(c.String("config")))
	if err != nil {
		return fail(ExitUsage, "config: %v", err)
	}
	cfg, err := config.Load(path)
	if err != nil {
		return fail(ExitUsage, "%v", err)
	}
	bin, err := os.Executable()
	if err == nil {
		bin, err = filepath.EvalSymlinks(bin)
	}
	if err != nil {
		return fail(ExitFailed, "find the deployd binary: %v", err)
	}
	units, err := SystemdUnits(cfg, bin, name, c.Bool("socket-unit"))
	if err != nil {
		return fail(ExitUsage, "%v", err)
	}
	w := c.App.Writer
	dir := c.String("unit-dir")
	if c.Bool("print") {
		for i, u := range units {
			if i > 0 {
				fmt.Fprintln(w)
			}
			fmt.Fprintf(w, "# %s\n%s", filepath.Join(dir, u.Name), u.Text)
		}
		return nil
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fail(ExitFailed, "unit dir %s: %v (run as root, or use --print or --unit-dir)", dir, err)
	}
	for _, u := range units {
		p := filepath.Join(dir, u.Name)
		if err := atomicfile.WriteFile(p, []byte(u.Text), 0o644); err != nil {
			return fail(ExitFailed, "write %s: %v (run as root, or use --print or --unit-dir)", p, err)
		}
		fmt.Fprintf(w, "wrote %s\n", p)
	}
	enable := make([]string, 0, len(units))
	for _, u := range units[1:] {
		enable = append(enable, u.Name)
	}
	enable = append(enable, name)
	fmt.Fprintf(w, "\nnext:\n  systemctl daemon-reload\n  systemctl enable --now %s\n", strings.Join(enable, " "))
	fmt.Fprintf(w, "then: systemctl status %s; journalctl -u %s -f; systemctl reload %s hands over to a new agent\n",
		name, name, name)
	return nil
}

// Unit is a systemd unit file.
type Unit struct {
	Name string // e.g. deployd.service
	Text string
}

// SystemdUnits renders the agent's service unit (first) and, with sockets,
// one socket unit per app and listen name. bin is the absolute path of the
// deployd binary; cfg.Path the absolute config path.
func SystemdUnits(cfg *config.Config, bin, name string, sockets bool) ([]Unit, error) {
	var socks []Unit
	if sockets {
		var err error
		if socks, err = socketUnits(cfg, name); err != nil {
			return nil, err
		}
	}
	var maxStop, maxReady time.Duration
	for _, app := range cfg.Apps {
		maxStop, maxReady = max(maxStop, app.StopTimeout), max(maxReady, app.ReadyTimeout)
	}
	var b strings.Builder
	header(&b, cfg)
	fmt.Fprintf(&b, "[Unit]\nDescription=deployd agent: zero-downtime app workers (%s)\n", escapeSpecifiers(cfg.Path))
	b.WriteString("After=network.target\n")
	for _, s := range socks {
		fmt.Fprintf(&b, "Requires=%s\nAfter=%s\n", s.Name, s.Name)
	}
	b.WriteString("\n[Service]\nType=notify\n")
	b.WriteString("# A handoff (systemctl reload, deployd upgrade) starts a new agent with a new pid;\n" +
		"# it sends MAINPID= and READY=1 itself, so every process of the unit may notify.\n")
	b.WriteString("NotifyAccess=all\n")
	fmt.Fprintf(&b, "ExecStart=%s agent -c %s\n", execArg(bin), execArg(cfg.Path))
	b.WriteString("ExecReload=/bin/kill -HUP $MAINPID\n")
	b.WriteString("# The stop waits until the agent has stopped every worker and exited: with\n" +
		"# KillMode=process systemd would not wait for a main pid that is not its child (an\n" +
		"# agent started by an upgrade). After a crash $MAINPID is unset and it does nothing.\n")
	fmt.Fprintf(&b, "ExecStop=%s shutdown -c %s --main-pid=${MAINPID} --timeout %ds\n", execArg(bin), execArg(cfg.Path),
		unitSeconds(maxStop))
	if cfg.Agent.PIDFile != "" {
		fmt.Fprintf(&b, "PIDFile=%s\n", escapeSpecifiers(cfg.Agent.PIDFile))
	}
	b.WriteString("# process: a stop sends SIGTERM to the agent alone, which stops each app's workers\n" +
		"# with its stop_signal and stop_timeout and exits once they are gone. If the agent\n" +
		"# dies (SIGKILL, crash), systemd leaves its workers alone and they keep serving;\n" +
		"# Restart= starts the next agent, which adopts them. The default (control-group)\n" +
		"# would SIGTERM every worker at once, and mixed SIGKILLs them all when the agent dies.\n")
	b.WriteString("KillMode=process\n")
	b.WriteString("# The agent puts each worker and hook in a cgroup of its own under the unit's, so that\n" +
		"# what one leaves running (a setsid daemon) is found and killed when it exits; the\n" +
		"# subtree is the agent's to manage.\n")
	b.WriteString("Delegate=yes\n")
	b.WriteString("# Apps with [apps.NAME.logs] target = \"journal\" or \"both\" log through the agent,\n" +
		"# so journald counts all their lines against this unit's rate limit (by default 10000\n" +
		"# in 30s) and drops the rest, saying only \"Suppressed N messages\" in the journal. Off here:\n" +
		"# every line that the output journal settles once must land once.\n")
	b.WriteString("LogRateLimitIntervalSec=0\n")
	fmt.Fprintf(&b, "# Longest ready_timeout (%s) and stop_timeout (%s) of the apps, plus a margin.\n", maxReady, maxStop)
	fmt.Fprintf(&b, "TimeoutStartSec=%d\nTimeoutStopSec=%d\n", unitSeconds(maxReady), unitSeconds(maxStop))
	b.WriteString("Restart=on-failure\nRestartSec=1\n")
	b.WriteString("# Every worker holds its listeners and log pipes; many connections need many descriptors.\n")
	b.WriteString("LimitNOFILE=65536\n")
	for _, s := range socks {
		fmt.Fprintf(&b, "Sockets=%s\n", s.Name)
	}
	b.WriteString(nonBlocking(cfg, sockets))
	b.WriteString("\n[Install]\nWantedBy=multi-user.target\n")
	return append([]Unit{{Name: name + ".service", Text: b.String()}}, socks...), nil
}

// nonBlocking is the service's NonBlocking= line for socket units: systemd
// sets one O_NONBLOCK mode for every socket it passes to the service, and the
// agent hands the sockets to the workers as they are.
func nonBlocking(cfg *config.Config, sockets bool) string {
	if !sockets {
		return ""
	}
	var yes, no []string
	for _, n := range cfg.AppNames {
		switch app := cfg.Apps[n]; {
		case len(app.Listen) == 0:
		case app.Nonblocking:
			yes = append(yes, n)
		default:
			no = append(no, n)
		}
	}
	switch {
	case len(yes) == 0:
		return ""
	case len(no) == 0:
		return "# The apps ask for non-blocking listeners (nonblocking = true).\nNonBlocking=yes\n"
	}
	return fmt.Sprintf("# NonBlocking= sets one mode for every socket: they stay blocking (as apps [%s]\n"+
		"# want), although apps [%s] set nonblocking = true.\n", strings.Join(no, " "), strings.Join(yes, " "))
}

// unitSeconds is d plus a margin for the agent's own work, at least systemd's
// default of 90 s.
func unitSeconds(d time.Duration) int {
	return int(max(90*time.Second, d+30*time.Second).Seconds())
}

// socketUnits renders one socket unit per app and listen name: systemd names
// every socket of a unit alike (FileDescriptorName=), so sockets with their
// own names need their own units.
func socketUnits(cfg *config.Config, name string) ([]Unit, error) {
	var units []Unit
	for _, appName := range cfg.AppNames {
		app := cfg.Apps[appName]
		var order []string
		byName := map[string][]config.Listen{}
		for _, l := range app.Listen {
			if byName[l.Name] == nil {
				order = append(order, l.Name)
			}
			byName[l.Name] = append(byName[l.Name], l)
		}
		for _, fdName := range order {
			unit := name + "-" + unitPart(appName)
			if fdName != appName {
				unit += "-" + unitPart(fdName)
			}
			var b strings.Builder
			header(&b, cfg)
			b.WriteString("# systemd keeps these sockets open while the agent restarts or crashes: connections\n" +
				"# wait in the queue instead of being refused. The agent adopts each one for the\n" +
				"# listen URL of the same address (or FileDescriptorName=).\n")
			fmt.Fprintf(&b, "[Unit]\nDescription=deployd listeners of app %s (fd name %s)\n\n[Socket]\n",
				escapeSpecifiers(appName), escapeSpecifiers(fdName))
			unix := false
			for _, l := range byName[fdName] {
				addr, err := listenStream(l)
				if err != nil {
					return nil, fmt.Errorf("app %s: listen %s: %w", appName, l.URL, err)
				}
				unix = unix || l.Network == "unix"
				fmt.Fprintf(&b, "ListenStream=%s\n", escapeSpecifiers(addr))
			}
			fmt.Fprintf(&b, "FileDescriptorName=%s\nService=%s.service\n", escapeSpecifiers(fdName), name)
			if unix {
				b.WriteString("RemoveOnStop=yes\n")
			}
			b.WriteString("\n[Install]\nWantedBy=sockets.target\n")
			units = append(units, Unit{Name: unit + ".socket", Text: b.String()})
		}
	}
	if len(units) == 0 {
		return nil, fmt.Errorf("--socket-unit: no app in %s has a listen address", cfg.Path)
	}
	return units, nil
}

// listenStream is the ListenStream= value that binds what the agent would:
// Go binds a wildcard host of tcp:// to both IPv4 and IPv6, as a bare port
// does in systemd; a host name is resolved as Go resolves it.
func listenStream(l config.Listen) (string, error) {
	if l.Network == "unix" {
		return l.Address, nil
	}
	host, port, err := net.SplitHostPort(l.Address)
	if err != nil {
		return "", err
	}
	addr, err := netip.ParseAddr(host)
	switch {
	case host == "" || err == nil && addr.IsUnspecified():
		switch l.Network {
		case "tcp4":
			return "0.0.0.0:" + port, nil
		case "tcp6":
			return "[::]:" + port, nil
		}
		return port, nil
	case err != nil:
		ta, rerr := net.ResolveTCPAddr(l.Network, l.Address)
		if rerr != nil {
			return "", fmt.Errorf("resolve %s: %w", host, rerr)
		}
		addr = ta.AddrPort().Addr()
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil {
		return "", fmt.Errorf("port %q: %w", port, err)
	}
	return netip.AddrPortFrom(addr.Unmap(), uint16(p)).String(), nil
}

func header(b *strings.Builder, cfg *config.Config) {
	fmt.Fprintf(b, "# Written by `deployd startup systemd` (deployd %s) for %s.\n", version.String(), cfg.Path)
	b.WriteString("# Run it again after changing listen addresses, stop_timeout or ready_timeout.\n")
}

// unitPart makes s usable in a unit name: other characters become '_'.
func unitPart(s string) string {
	return strings.Map(func(r rune) rune {
		if r < 0x80 && (r == '-' || r == '_' || r == '.' || r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z') {
			return r
		}
		return '_'
	}, s)
}

func validUnitPrefix(s string) bool { return s != "" && unitPart(s) == s && !strings.HasPrefix(s, ".") }

// escapeSpecifiers escapes systemd's % specifiers.
func escapeSpecifiers(s string) string { return strings.ReplaceAll(s, "%", "%%") }

// execArg quotes one ExecStart= word: % and $ are escaped, and a word with
// spaces, quotes or backslashes is double-quoted.
func execArg(s string) string {
	s = strings.ReplaceAll(escapeSpecifiers(s), "$", "$$")
	if !strings.ContainsAny(s, " \t\"'\\;") {
		return s
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
