package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/deployd/deployd/agent/api"
)

func logsCommand() *cli.Command {
	return &cli.Command{
		Name:      "logs",
		Usage:     "print an app's log, follow it, rotate or empty the log files",
		ArgsUsage: "[APP]",
		Description: "Prints the last -n lines of the workers' stdout (log_dir/APP.out.log), then the last\n" +
			"-n of their stderr (APP.err.log), each line marked \"out |\" or \"err |\" (err in red on a\n" +
			"terminal); --out or --err prints one of them, unmarked. It reads on into the rotated\n" +
			"files when the current one is shorter; with -f it then prints every new line of both as\n" +
			"it comes, across rotations and agent upgrades (it goes on with the new agent from the\n" +
			"line where the old one stopped), until Ctrl-C. Without APP it prints every app's log,\n" +
			"each line prefixed with the app's name. The agent writes out what it still holds\n" +
			"first, so lines a worker just printed show up.\n\n" +
			"--rotate starts new log files now, as SIGUSR1 does (for an external logrotate).\n" +
			"--flush empties the log files and removes the rotated ones.\n\n" +
			"Examples: deployd logs web -f\n" +
			"          deployd logs --err -n 100     # crash output only\n" +
			"          deployd logs --flush web",
		Flags: clientFlags(jsonFlag,
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new lines until Ctrl-C"},
			&cli.IntFlag{Name: "lines", Aliases: []string{"n"}, Value: 20, Usage: "print the last `N` lines first"},
			&cli.BoolFlag{Name: "err", Usage: "only the workers' stderr (APP.err.log)"},
			&cli.BoolFlag{Name: "out", Usage: "only the workers' stdout (APP.out.log)"},
			&cli.BoolFlag{Name: "rotate", Usage: "rotate the log files now, then exit"},
			&cli.BoolFlag{Name: "flush", Usage: "empty the log files (removing the rotated ones), then exit"},
		),
		Action: runLogs,
	}
}

func runLogs(c *cli.Context) error {
	if c.NArg() > 1 {
		return fail(ExitUsage, "usage: deployd logs [APP] [-f] [-n N] [--out|--err] | --rotate [APP] | --flush [APP]")
	}
	app, err := appArg(c, c.Args().First())
	if err != nil {
		return err
	}
	if app == allApps && cfgHasNo(c, allApps) {
		app = ""
	}
	rotate, flush := c.Bool("rotate"), c.Bool("flush")
	switch {
	case rotate && flush:
		return fail(ExitUsage, "--rotate and --flush: use one at a time")
	case c.Bool("out") && c.Bool("err"):
		return fail(ExitUsage, "--out and --err: both streams are what deployd logs prints without either")
	case (rotate || flush) && (c.Bool("follow") || c.IsSet("lines") || c.Bool("err") || c.Bool("out")):
		return fail(ExitUsage, "--rotate and --flush act on both log files and print no lines; drop -f, -n, --out and --err")
	case rotate:
		return logFiles(c, "rotated", func(cx context.Context, cl *api.Client) (*api.LogFilesResult, error) {
			return cl.RotateLogs(cx, app)
		})
	case flush:
		return logFiles(c, "emptied", func(cx context.Context, cl *api.Client) (*api.LogFilesResult, error) {
			return cl.FlushLogs(cx, app)
		})
	}
	n := c.Int("lines")
	if n < 0 || n > api.MaxLogLines {
		return fail(ExitUsage, "-n %d: want 0 to %d lines", n, api.MaxLogLines)
	}
	follow := c.Bool("follow")
	cx := ctx(c)
	if follow {
		var stop context.CancelFunc
		cx, stop = signal.NotifyContext(cx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	// Lines go out in blocks, except when following: then each as it comes.
	out := bufio.NewWriterSize(c.App.Writer, 64<<10)
	defer out.Flush()
	p := linePrinter{out: out, json: c.Bool("json"), prefix: app == "", errw: c.App.ErrWriter, sync: follow,
		color: isTerminal(c.App.Writer)}
	streams := []string{"out", "err"}
	if c.Bool("out") || c.Bool("err") {
		streams = []string{""} // the one asked for, unmarked
	}
	err = logStreams(cx, client(c), api.LogsRequest{App: app, Lines: n, Err: c.Bool("err"), Follow: follow}, streams, &p)
	if err == nil && p.failed {
		return fail(ExitFailed, "")
	}
	if errors.Is(err, api.ErrLogStreamCut) {
		return fail(ExitFailed, "%v", err)
	}
	return err
}

// logStreams prints req's lines: one stream unmarked (streams is [""]), or
// stdout's and stderr's marked: without follow stdout's last lines, then
// stderr's; with follow both at once, each line as it comes.
func logStreams(cx context.Context, cl *api.Client, req api.LogsRequest, streams []string, p *linePrinter) error {
	if len(streams) == 1 {
		return followAcross(cx, cl, req, func(l api.LogLine) { p.print(l, streams[0]) })
	}
	if !req.Follow {
		for _, s := range streams {
			r := req
			r.Err = s == "err"
			if err := followAcross(cx, cl, r, func(l api.LogLine) { p.print(l, s) }); err != nil {
				return err
			}
		}
		return nil
	}
	cx, cancel := context.WithCancel(cx)
	defer cancel()
	errs := make(chan error, len(streams))
	for _, s := range streams {
		r := req
		r.Err = s == "err"
		go func() {
			err := followAcross(cx, cl, r, func(l api.LogLine) { p.print(l, s) })
			if err != nil {
				cancel() // one stream failed: end the other
			}
			errs <- err
		}()
	}
	var first error
	for range streams {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// reconnectFor bounds how long a follow the agent ended tries to reach the
// next agent (after an upgrade the new one serves the same socket at once;
// after a shutdown nobody does).
const reconnectFor = 5 * time.Second

// followAcross runs req; when the agent ends a follow (an agent upgrade),
// it goes on with the agent that then serves the socket from where each
// log stopped, so no line is lost or printed twice.
func followAcross(cx context.Context, cl *api.Client, req api.LogsRequest, fn func(api.LogLine)) error {
	for {
		err := cl.Logs(cx, req, fn)
		if req.Follow && cx.Err() != nil {
			// Ctrl-C, also before the agent answered: it sends the
			// answer's head with the first line, so a follow of an empty
			// log waits for it.
			return nil
		}
		var ended *api.FollowEndedError
		if !req.Follow || !errors.As(err, &ended) {
			return err
		}
		req.Resume, req.Lines = ended.Resume, 0
		deadline := time.Now().Add(reconnectFor)
		for {
			_, serr := cl.Status(cx, "")
			if serr == nil {
				break
			}
			if cx.Err() != nil {
				return nil
			}
			if time.Now().After(deadline) {
				return err
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// linePrinter prints the lines of a logs answer. Safe for concurrent use
// (a follow of both streams prints from two goroutines).
type linePrinter struct {
	mu     sync.Mutex
	out    *bufio.Writer
	errw   io.Writer
	json   bool // print each api.LogLine as JSON
	prefix bool // prefix each line with its app
	sync   bool // flush after each line
	color  bool // mark stderr lines in red (a terminal)
	failed bool // a log could not be read
}

// markedLine is a LogLine with its stream, as --json prints it when both
// streams are printed.
type markedLine struct {
	api.LogLine
	Stream string `json:"stream"`
}

// print prints l of stream ("out", "err", or "" when one stream is printed
// unmarked).
func (p *linePrinter) print(l api.LogLine, stream string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	mark := ""
	switch {
	case stream == "":
	case stream == "err" && p.color:
		mark = "\033[31merr\033[0m | "
	default:
		mark = stream + " | "
	}
	switch {
	case p.json && stream != "":
		b, _ := json.Marshal(markedLine{l, stream})
		p.out.Write(append(b, '\n'))
	case p.json:
		b, _ := json.Marshal(l)
		p.out.Write(append(b, '\n'))
	case l.Error != "":
		p.out.Flush()
		fmt.Fprintf(p.errw, "deployd: %s: %s\n", l.App, l.Error)
	case p.prefix:
		fmt.Fprintf(p.out, "%s | %s%s\n", l.App, mark, l.Line)
	default:
		p.out.WriteString(mark)
		p.out.WriteString(l.Line)
		p.out.WriteByte('\n')
	}
	if l.Error != "" {
		p.failed = true
	}
	if p.sync {
		p.out.Flush()
	}
}

// logFiles runs --rotate or --flush and prints the files it acted on.
func logFiles(c *cli.Context, verb string, call func(context.Context, *api.Client) (*api.LogFilesResult, error)) error {
	res, err := call(ctx(c), client(c))
	if err != nil {
		return err
	}
	if c.Bool("json") {
		enc := json.NewEncoder(c.App.Writer)
		enc.SetIndent("", "  ")
		if err := enc.Encode(res); err != nil {
			return err
		}
	} else {
		for _, f := range res.Files {
			fmt.Fprintf(c.App.Writer, "%s %s\n", verb, f)
		}
	}
	if len(res.Errors) > 0 {
		for _, e := range res.Errors {
			fmt.Fprintf(c.App.ErrWriter, "deployd: %s\n", e)
		}
		return fail(ExitFailed, "")
	}
	return nil
}
