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
		Description: "Prints the last -n lines of log_dir/APP.out.log (APP.err.log with --err), reading\n" +
			"on into the rotated files when the current one is shorter; with -f it then prints\n" +
			"every new line, across rotations and agent upgrades (it goes on with the new agent\n" +
			"from the line where the old one stopped), until Ctrl-C. Without APP it prints every app's\n" +
			"log, each line prefixed with the app's name. The agent writes out what it still\n" +
			"holds first, so lines a worker just printed show up.\n\n" +
			"--rotate starts new log files now, as SIGUSR1 does (for an external logrotate).\n" +
			"--flush empties the log files and removes the rotated ones.\n\n" +
			"Examples: deployd logs web -f\n" +
			"          deployd logs --err -n 100\n" +
			"          deployd logs --flush web",
		Flags: clientFlags(jsonFlag,
			&cli.BoolFlag{Name: "follow", Aliases: []string{"f"}, Usage: "keep printing new lines until Ctrl-C"},
			&cli.IntFlag{Name: "lines", Aliases: []string{"n"}, Value: 20, Usage: "print the last `N` lines first"},
			&cli.BoolFlag{Name: "err", Usage: "the workers' stderr (APP.err.log) instead of stdout"},
			&cli.BoolFlag{Name: "rotate", Usage: "rotate the log files now, then exit"},
			&cli.BoolFlag{Name: "flush", Usage: "empty the log files (removing the rotated ones), then exit"},
		),
		Action: runLogs,
	}
}

func runLogs(c *cli.Context) error {
	if c.NArg() > 1 {
		return fail(ExitUsage, "usage: deployd logs [APP] [-f] [-n N] [--err] | --rotate [APP] | --flush [APP]")
	}
	app := c.Args().First()
	rotate, flush := c.Bool("rotate"), c.Bool("flush")
	switch {
	case rotate && flush:
		return fail(ExitUsage, "--rotate and --flush: use one at a time")
	case (rotate || flush) && (c.Bool("follow") || c.IsSet("lines") || c.Bool("err")):
		return fail(ExitUsage, "--rotate and --flush act on both log files and print no lines; drop -f, -n and --err")
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
	req := api.LogsRequest{App: app, Lines: n, Err: c.Bool("err"), Follow: c.Bool("follow")}
	cx := ctx(c)
	if req.Follow {
		var stop context.CancelFunc
		cx, stop = signal.NotifyContext(cx, os.Interrupt, syscall.SIGTERM)
		defer stop()
	}
	// Lines go out in blocks, except when following: then each as it comes.
	out := bufio.NewWriterSize(c.App.Writer, 64<<10)
	defer out.Flush()
	p := linePrinter{out: out, json: c.Bool("json"), prefix: app == "", errw: c.App.ErrWriter, sync: req.Follow}
	err := followAcross(cx, client(c), req, p.print)
	if err == nil && p.failed {
		return fail(ExitFailed, "")
	}
	if errors.Is(err, api.ErrLogStreamCut) {
		return fail(ExitFailed, "%v", err)
	}
	return err
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

// linePrinter prints the lines of a logs answer.
type linePrinter struct {
	out    *bufio.Writer
	errw   io.Writer
	json   bool // print each api.LogLine as JSON
	prefix bool // prefix each line with its app
	sync   bool // flush after each line
	failed bool // a log could not be read
}

func (p *linePrinter) print(l api.LogLine) {
	switch {
	case p.json:
		b, _ := json.Marshal(l)
		p.out.Write(append(b, '\n'))
	case l.Error != "":
		p.out.Flush()
		fmt.Fprintf(p.errw, "deployd: %s: %s\n", l.App, l.Error)
	case p.prefix:
		fmt.Fprintf(p.out, "%s | %s\n", l.App, l.Line)
	default:
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
