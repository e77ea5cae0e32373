package cli

import (
	"context"
	"fmt"
	"io"
	"net"
	neturl "net/url"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
	"github.com/deployd/deployd/cli/dashboard"
)

func dashboardCommand() *cli.Command {
	return &cli.Command{
		Name:  "dashboard",
		Usage: "serve a live web page of the apps, workers, timeline and logs",
		Description: "Serves a read-only web page on --listen (loopback by default) and prints its URL,\n" +
			"which holds a random token: any other URL gets 403. When there is a display (DISPLAY or\n" +
			"WAYLAND_DISPLAY) and no --no-open, it opens the page with xdg-open through a private\n" +
			"file that redirects to the URL, so the token is on no command line. The page shows\n" +
			"every app with its workers (slot, pid, state, release, uptime, restarts, CPU and RSS\n" +
			"plots), a timeline of what changed (new workers, crashes, restarts, state changes) and\n" +
			"a live tail of each app's log, stderr in red. This command reads the agent's status\n" +
			"once a second and follows the logs over the control socket as the user who runs it,\n" +
			"for every page open; it runs until Ctrl-C. Every asset is in the binary.\n\n" +
			"Examples: deployd dashboard\n" +
			"          deployd dashboard --listen 127.0.0.1:8700 --no-open",
		Flags: clientFlags(
			&cli.StringFlag{Name: "listen", Value: "127.0.0.1:0", Usage: "serve the page on `ADDR` (port 0: any free port)"},
			&cli.BoolFlag{Name: "no-open", Usage: "only print the URL, do not run xdg-open"},
		),
		Action: runDashboard,
	}
}

func runDashboard(c *cli.Context) error {
	if c.NArg() > 0 {
		return fail(ExitUsage, "usage: deployd dashboard [--listen ADDR] [--no-open]")
	}
	cx, stop := signal.NotifyContext(ctx(c), os.Interrupt, syscall.SIGTERM)
	defer stop()
	cl := client(c)
	// The agent must answer before anything is served: a wrong socket is
	// told now, not on the page.
	if _, err := cl.Version(cx); err != nil {
		return err
	}
	ln, err := net.Listen("tcp", c.String("listen"))
	if err != nil {
		return fail(ExitUsage, "--listen %s: %v", c.String("listen"), err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	token := dashboard.NewToken()
	srv, err := dashboard.New(dashboard.Options{
		Source: dashSource{cl},
		Token:  token,
		Log:    hclog.New(&hclog.LoggerOptions{Name: "dashboard", Output: c.App.ErrWriter, Level: hclog.Warn}),
	})
	if err != nil {
		ln.Close()
		return err
	}
	host := addr.IP.String()
	if addr.IP.IsUnspecified() {
		host = "127.0.0.1"
	}
	url := fmt.Sprintf("http://%s/%s/", net.JoinHostPort(host, fmt.Sprint(addr.Port)), token)
	if !addr.IP.IsLoopback() {
		fmt.Fprintf(c.App.ErrWriter, "deployd: warning: the dashboard listens on %s, beyond this machine, over plain HTTP; "+
			"the token in the URL is all that keeps others out\n", ln.Addr())
	}
	fmt.Fprintf(c.App.Writer, "dashboard: %s\n(read-only; Ctrl-C stops it)\n", url)
	opened := make(chan struct{})
	if !c.Bool("no-open") && (os.Getenv("DISPLAY") != "" || os.Getenv("WAYLAND_DISPLAY") != "") {
		go func() {
			defer close(opened)
			openBrowser(cx, c.App.ErrWriter, srv, url)
		}()
	} else {
		close(opened)
	}
	err = srv.Run(cx, ln)
	<-opened
	return err
}

// redirectTTL bounds how long the page that redirects to the dashboard
// stays on disk when no browser comes.
const redirectTTL = time.Minute

// openBrowser opens the dashboard with xdg-open through a private page
// that redirects to url: the token goes on no command line (every local
// user reads those in /proc/PID/cmdline) and into no environment. The page
// is removed once a browser came with the token, after redirectTTL, or
// when the dashboard stops.
func openBrowser(cx context.Context, errw io.Writer, srv *dashboard.Server, url string) {
	path, remove, err := dashboard.RedirectPage(url)
	if err != nil {
		fmt.Fprintf(errw, "deployd: warning: no browser opened: %v; open the URL above\n", err)
		return
	}
	defer remove()
	xdg := make(chan struct{})
	go func() {
		defer close(xdg)
		// Its output would mix with ours; a failure only means no browser opened.
		_ = exec.CommandContext(cx, "xdg-open", (&neturl.URL{Scheme: "file", Path: path}).String()).Run()
	}()
	select {
	case <-srv.Visited():
	case <-time.After(redirectTTL):
	case <-cx.Done():
	}
	remove()
	<-xdg // some xdg-open wait for the browser: until the dashboard stops
}

// dashSource reads the agent for the dashboard through the control client.
type dashSource struct{ cl *api.Client }

func (s dashSource) Status(cx context.Context) (*api.Status, error) { return s.cl.Status(cx, "") }

func (s dashSource) Logs(cx context.Context, errStream bool, lines int, fn func(api.LogLine)) error {
	return followAcross(cx, s.cl, api.LogsRequest{Lines: lines, Err: errStream, Follow: true}, fn)
}
