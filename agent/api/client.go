package api

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"syscall"
	"time"
)

// Client talks to an agent over its control socket. Safe for concurrent use.
type Client struct {
	Socket string
	hc     *http.Client
}

// NewClient returns a client for the agent at socket.
func NewClient(socket string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", socket)
		},
		MaxIdleConns: 4,
		// Shorter than the agent's idle timeout (2 min): the client drops
		// an idle connection before the agent closes it under a request.
		IdleConnTimeout: 30 * time.Second,
	}
	return &Client{Socket: socket, hc: &http.Client{Transport: tr}}
}

// StoppingHeader marks an agent's answer that it is stopping and did
// nothing with the request (KindStopping): the client may ask again.
const StoppingHeader = "Deployd-Stopping"

// UnreachableError says the agent could not be reached.
type UnreachableError struct {
	Socket string
	Err    error
	Denied bool // the socket's permissions refused this user
}

func (e *UnreachableError) Error() string {
	if e.Denied {
		return fmt.Sprintf("permission denied on the agent's socket %s: run as the agent's user or root, "+
			"or set [agent] socket_group and join that group", e.Socket)
	}
	return fmt.Sprintf("cannot reach the deployd agent at %s: %v (is `deployd agent` running? "+
		"pass --socket or set DEPLOYD_SOCKET if it uses another socket)", e.Socket, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// StatusError is a non-2xx answer of the agent.
type StatusError struct {
	Code    int
	Kind    Kind
	Reason  string // Error.Reason
	Message string
}

func (e *StatusError) Error() string { return e.Message }

// IsUsage reports whether the agent rejected the request as invalid
// (bad input, unknown app, invalid config): the CLI exits 2.
func (e *StatusError) IsUsage() bool { return e.Kind.ExitCode() == ExitUsage }

func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	return c.doOn(ctx, c.hc, method, path, body)
}

// doOn sends a request with hc (c.hc, or withFile's one-shot client).
func (c *Client) doOn(ctx context.Context, hc *http.Client, method, path string, body any) (*http.Response, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return nil, err
		}
	}
	send := func() (*http.Response, error) {
		var rd io.Reader
		if body != nil {
			rd = bytes.NewReader(b)
		}
		req, err := http.NewRequestWithContext(ctx, method, "http://deployd"+path, rd)
		if err != nil {
			return nil, err
		}
		if body != nil {
			req.Header.Set("Content-Type", "application/json")
		}
		return hc.Do(req)
	}
	resp, err := send()
	switch {
	case err != nil && method == http.MethodGet && ctx.Err() == nil && !isDial(err):
		// A read-only request whose connection an agent closed unanswered
		// (it crashed, or was killed, with the request in flight) is asked
		// once more: a new agent may answer.
		resp, err = send()
	case err == nil && resp.StatusCode == http.StatusServiceUnavailable && resp.Header.Get(StoppingHeader) != "" && hc == c.hc:
		// The agent is stopping and did nothing (agent/control/server.go): ask
		// once more. After a handoff the new agent answers; after a
		// shutdown the dial fails: unreachable. (Not for withFile's
		// one-shot client: its file went with the first request.)
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		resp, err = send()
	}
	if err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) && ne.Op == "dial" {
			if errors.Is(ne.Err, syscall.EACCES) {
				return nil, &UnreachableError{Socket: c.Socket, Err: ne.Err, Denied: true}
			}
			return nil, &UnreachableError{Socket: c.Socket, Err: ne.Err}
		}
		return nil, &TransportError{Socket: c.Socket, Err: err}
	}
	if resp.StatusCode/100 != 2 {
		defer resp.Body.Close()
		var e Error
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		if json.Unmarshal(b, &e) != nil || e.Error == "" {
			e.Error = fmt.Sprintf("agent answered %s: %s", resp.Status, bytes.TrimSpace(b))
		}
		if e.Kind == "" {
			e.Kind = KindOfStatus(resp.StatusCode)
		}
		return nil, &StatusError{Code: resp.StatusCode, Kind: e.Kind, Reason: e.Reason, Message: e.Error}
	}
	return resp, nil
}

// isDial reports whether err is a failure to connect (no agent there).
func isDial(err error) bool {
	var ne *net.OpError
	return errors.As(err, &ne) && ne.Op == "dial"
}

func (c *Client) getJSON(ctx context.Context, method, path string, in, out any) error {
	resp, err := c.do(ctx, method, path, in)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("agent answer: %w", err)
	}
	return nil
}

// Status returns the agent's status; app "" means every app.
func (c *Client) Status(ctx context.Context, app string) (*Status, error) {
	path := PathStatus
	if app != "" {
		path += "?app=" + url.QueryEscape(app)
	}
	var st Status
	return &st, c.getJSON(ctx, http.MethodGet, path, nil, &st)
}

// Version returns the agent's version and pid.
func (c *Client) Version(ctx context.Context) (*VersionInfo, error) {
	var v VersionInfo
	return &v, c.getJSON(ctx, http.MethodGet, PathVersion, nil, &v)
}

// Shutdown asks the agent to stop its workers and exit.
func (c *Client) Shutdown(ctx context.Context) error {
	return c.getJSON(ctx, http.MethodPost, PathShutdown, struct{}{}, nil)
}

// Reload runs a reload and calls onEvent for each progress event.
func (c *Client) Reload(ctx context.Context, req ReloadRequest, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathReload, req, onEvent)
}

// Restart stops and starts every worker of app.
func (c *Client) Restart(ctx context.Context, app string, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathRestart, AppRequest{App: app}, onEvent)
}

// Stream posts body to path and reads a stream of StreamLines until the result.
func (c *Client) Stream(ctx context.Context, path string, body any, onEvent func(Event)) (*Result, error) {
	return c.streamOn(ctx, c.hc, path, body, onEvent)
}

func (c *Client) streamOn(ctx context.Context, hc *http.Client, path string, body any, onEvent func(Event)) (*Result, error) {
	resp, err := c.doOn(ctx, hc, http.MethodPost, path, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		var l StreamLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			return nil, fmt.Errorf("agent answer: %w", err)
		}
		if l.Event != nil && onEvent != nil {
			onEvent(*l.Event)
		}
		if l.Result != nil {
			return l.Result, nil
		}
		if l.Deploy != nil {
			return &Result{OK: l.Deploy.Status != DeployFailed, Deploy: l.Deploy}, nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, &TransportError{Socket: c.Socket, Err: err, Midway: true}
	}
	return nil, &TransportError{Socket: c.Socket, Err: errors.New("connection closed before the result"), Midway: true}
}

// TransportError is a failure talking to an agent that was reached: the
// connection broke, or the agent stopped in the middle of an answer.
type TransportError struct {
	Socket string
	Err    error
	Midway bool // the operation had started
}

func (e *TransportError) Error() string {
	if e.Midway {
		return fmt.Sprintf("the agent at %s stopped answering during the operation (%v); did it stop or crash? check `deployd status`", e.Socket, e.Err)
	}
	return fmt.Sprintf("the agent at %s did not answer (%v); is it stopping? try again, or check `deployd status`", e.Socket, e.Err)
}

func (e *TransportError) Unwrap() error { return e.Err }

// WaitReady polls the agent until it answers or timeout passes.
func (c *Client) WaitReady(ctx context.Context, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		_, err := c.Version(ctx)
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Upgrade asks the agent to hand off to a new binary; it returns when the
// new agent is ready or the upgrade failed. With binary set, the agent
// installs the bytes of that open file (req.Attached is set for it);
// Upgrade closes binary once sent.
func (c *Client) Upgrade(ctx context.Context, req UpgradeRequest, binary *os.File) (*UpgradeResult, error) {
	hc := c.hc
	if binary != nil {
		req.Attached, req.Binary = true, ""
		hc = c.withFile(binary)
	}
	resp, err := c.doOn(ctx, hc, http.MethodPost, PathUpgrade, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var res UpgradeResult
	if err := json.NewDecoder(resp.Body).Decode(&res); err != nil {
		return nil, fmt.Errorf("agent answer: %w", err)
	}
	return &res, nil
}

// Deploy installs an artifact and rolls the app to it. With artifact set,
// the agent reads the artifact from that open file (a regular file, or a
// pipe carrying a tar stream for KindDir; req.Attached is set for it);
// Deploy closes artifact once sent.
func (c *Client) Deploy(ctx context.Context, req DeployRequest, artifact *os.File, onEvent func(Event)) (*DeployResult, error) {
	hc := c.hc
	if artifact != nil {
		req.Attached, req.Artifact = true, ""
		hc = c.withFile(artifact)
	}
	res, err := c.streamOn(ctx, hc, PathDeploy, req, onEvent)
	if err != nil {
		return nil, err
	}
	return res.Deploy, nil
}

// Rollback rolls the app back to its previous release (or req.To).
func (c *Client) Rollback(ctx context.Context, req RollbackRequest, onEvent func(Event)) (*DeployResult, error) {
	res, err := c.Stream(ctx, PathRollback, req, onEvent)
	if err != nil {
		return nil, err
	}
	return res.Deploy, nil
}

// Releases lists app's releases.
func (c *Client) Releases(ctx context.Context, app string) (*Releases, error) {
	var r Releases
	return &r, c.getJSON(ctx, http.MethodGet, PathReleases+"?app="+url.QueryEscape(app), nil, &r)
}

// Scale changes app's worker count ("N", "+N" or "-N").
func (c *Client) Scale(ctx context.Context, app, instances string, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathScale, ScaleRequest{App: app, Instances: instances}, onEvent)
}

// Pause makes app's new connections wait in the kernel until Resume, or
// for max at most (0: no maximum).
func (c *Client) Pause(ctx context.Context, app string, max time.Duration, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathPause, PauseRequest{App: app, MaxSeconds: max.Seconds()}, onEvent)
}

// Resume ends app's connection pause: the connections that waited are
// served first.
func (c *Client) Resume(ctx context.Context, app string, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathResume, AppRequest{App: app}, onEvent)
}

// StopApp stops app's workers until StartApp (persisted).
func (c *Client) StopApp(ctx context.Context, app string, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathStop, AppRequest{App: app}, onEvent)
}

// StartApp starts an app stopped by StopApp.
func (c *Client) StartApp(ctx context.Context, app string, onEvent func(Event)) (*Result, error) {
	return c.Stream(ctx, PathStart, AppRequest{App: app}, onEvent)
}
