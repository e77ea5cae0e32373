package api

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
)

// Paths of the log calls.
const (
	// PathLogs streams the last lines of app logs, then (follow=1) new ones:
	// GET /v1/logs?app=web&n=20&err=1&follow=1, answered with LogLines.
	PathLogs = "/v1/logs"
	// PathLogsRotate rotates the log files now (as SIGUSR1 does).
	PathLogsRotate = "/v1/logs/rotate"
	// PathLogsFlush empties the log files, removing the rotated ones.
	PathLogsFlush = "/v1/logs/flush"
)

// MaxLogLines bounds the n of GET /v1/logs.
const MaxLogLines = 100_000

// LogsRequest asks for the last Lines lines of one app's log (every app's
// when App is empty), stdout's unless Err, then every new line if Follow.
type LogsRequest struct {
	App    string
	Lines  int
	Err    bool
	Follow bool
}

// LogLine is one line of the answer of GET /v1/logs (NDJSON). A line of the
// log has App and Line; Error reports a log that could not be read (the
// others go on); Done ends an answer without follow, so a client can tell a
// complete answer from a cut connection.
type LogLine struct {
	App   string `json:"app,omitempty"`
	Line  string `json:"line"`
	Error string `json:"error,omitempty"`
	Done  bool   `json:"done,omitempty"`
}

// LogFilesRequest is the body of POST /v1/logs/rotate and /v1/logs/flush.
type LogFilesRequest struct {
	App string `json:"app,omitempty"` // empty = every app
}

// LogFilesResult is their answer: the files acted on, or why not.
type LogFilesResult struct {
	Files  []string `json:"files"`
	Errors []string `json:"errors,omitempty"`
}

// ErrLogStreamCut says the agent ended a log stream early (it stopped, or
// handed over to a new agent).
var ErrLogStreamCut = errors.New("the agent closed the log stream (did it stop or hand over to a new agent?)")

// Logs calls fn with every line of the answer to req, in order, until the
// answer ends (without Follow) or ctx is done (then it returns nil). A
// follow that the agent ends returns ErrLogStreamCut.
func (c *Client) Logs(ctx context.Context, req LogsRequest, fn func(LogLine)) error {
	q := url.Values{}
	if req.App != "" {
		q.Set("app", req.App)
	}
	q.Set("n", strconv.Itoa(req.Lines))
	if req.Err {
		q.Set("err", "1")
	}
	if req.Follow {
		q.Set("follow", "1")
	}
	resp, err := c.do(ctx, http.MethodGet, PathLogs+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var l LogLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("agent answer: %w", err)
		}
		if l.Done {
			return nil
		}
		fn(l)
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrLogStreamCut, err)
	}
	return ErrLogStreamCut
}

// RotateLogs rotates the log files of app (every app's when "") now.
func (c *Client) RotateLogs(ctx context.Context, app string) (*LogFilesResult, error) {
	var res LogFilesResult
	return &res, c.getJSON(ctx, http.MethodPost, PathLogsRotate, LogFilesRequest{App: app}, &res)
}

// FlushLogs empties the log files of app (every app's when "").
func (c *Client) FlushLogs(ctx context.Context, app string) (*LogFilesResult, error) {
	var res LogFilesResult
	return &res, c.getJSON(ctx, http.MethodPost, PathLogsFlush, LogFilesRequest{App: app}, &res)
}
