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
	"strings"
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
	// Resume goes on from where a follow the agent ended stopped, per app
	// (FollowEndedError), instead of printing the last Lines lines.
	Resume []LogPos
}

// LogPos is where a follow stopped in one app's log: the file (device and
// inode, 0 if none existed yet) and the offset of the first line not sent.
type LogPos struct {
	App    string `json:"app"`
	Dev    uint64 `json:"dev"`
	Ino    uint64 `json:"ino"`
	Offset int64  `json:"offset"`
}

// String is its form in the resume query parameter: dev:ino:offset:app.
func (p LogPos) String() string { return fmt.Sprintf("%d:%d:%d:%s", p.Dev, p.Ino, p.Offset, p.App) }

// ParseLogPos reads LogPos.String's form.
func ParseLogPos(s string) (LogPos, error) {
	f := strings.SplitN(s, ":", 4)
	if len(f) != 4 || f[3] == "" {
		return LogPos{}, fmt.Errorf("resume=%q: want dev:ino:offset:app", s)
	}
	var p LogPos
	var err1, err2, err3 error
	p.Dev, err1 = strconv.ParseUint(f[0], 10, 64)
	p.Ino, err2 = strconv.ParseUint(f[1], 10, 64)
	p.Offset, err3 = strconv.ParseInt(f[2], 10, 64)
	if err := errors.Join(err1, err2, err3); err != nil || p.Offset < 0 {
		return LogPos{}, fmt.Errorf("resume=%q: want dev:ino:offset:app", s)
	}
	p.App = f[3]
	return p, nil
}

// FollowEndedError is what Logs returns when the agent ended a follow
// while the client was still there (it stopped, or handed over to a new
// agent, which serves the same socket): Resume says where each log
// stopped. It is an ErrLogStreamCut.
type FollowEndedError struct{ Resume []LogPos }

func (e *FollowEndedError) Error() string { return ErrLogStreamCut.Error() }
func (e *FollowEndedError) Unwrap() error { return ErrLogStreamCut }

// LogLine is one line of the answer of GET /v1/logs (NDJSON). A line of the
// log has App and Line; Error reports a log that could not be read (the
// others go on); Done ends an answer without follow, so a client can tell a
// complete answer from a cut connection.
type LogLine struct {
	App   string `json:"app,omitempty"`
	Line  string `json:"line"`
	Error string `json:"error,omitempty"`
	Done  bool   `json:"done,omitempty"`
	// Resume, in the last lines of a follow the agent ends, says where the
	// app's log stopped.
	Resume *LogPos `json:"resume,omitempty"`
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
// handed over to a new agent, or dropped a client that stopped reading:
// each write of an answer has a deadline of 30 s).
var ErrLogStreamCut = errors.New("the agent closed the log stream (did it stop or hand over to a new agent? " +
	"it also drops a client that takes nothing for 30s)")

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
	for _, p := range req.Resume {
		q.Add("resume", p.String())
	}
	resp, err := c.do(ctx, http.MethodGet, PathLogs+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	var resume []LogPos
	for sc.Scan() {
		var l LogLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return fmt.Errorf("agent answer: %w", err)
		}
		switch {
		case l.Done:
			return nil
		case l.Resume != nil:
			resume = append(resume, *l.Resume)
		default:
			fn(l)
		}
	}
	if ctx.Err() != nil {
		return nil
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%w: %w", ErrLogStreamCut, err)
	}
	if resume != nil {
		return &FollowEndedError{Resume: resume}
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
