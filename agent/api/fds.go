package api

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sync"

	"golang.org/x/sys/unix"
)

// Passing a file to the agent.
//
// The agent never opens a path a client names (it may be root; the client
// may not be): the client opens the artifact or binary itself, with its own
// permissions, and passes the open descriptor. Such a request goes on a
// connection of its own. The client sends the descriptor with SCM_RIGHTS on
// the first bytes of the HTTP request and says so in the body
// (DeployRequest.Attached, UpgradeRequest.Attached). The agent collects the
// descriptors that arrive on any read of a connection (FileConn); the
// handler takes them, and any it does not take are closed with the
// connection. The agent holds at most MaxFiles descriptors per connection
// and closes any beyond that.
//
// Plain HTTP clients (curl) keep working for every other request: a
// connection that sends no descriptor is an ordinary one.

// MaxFiles is how many descriptors one connection may pass.
const MaxFiles = 1

// FileConn is the agent's side of a control connection: it keeps the
// descriptors the client passed until a handler takes them. Safe for
// concurrent use.
type FileConn struct {
	*net.UnixConn
	mu    sync.Mutex
	files []*os.File
	oob   []byte
}

// NewFileConn wraps c.
func NewFileConn(c *net.UnixConn) *FileConn {
	return &FileConn{UnixConn: c, oob: make([]byte, unix.CmsgSpace(4*MaxFiles))}
}

// Read reads data and keeps any descriptors that came with it.
func (c *FileConn) Read(b []byte) (int, error) {
	n, oobn, _, _, err := c.UnixConn.ReadMsgUnix(b, c.oob)
	if oobn > 0 {
		c.keep(c.oob[:oobn])
	}
	// ReadMsgUnix can return -1 with an error (a connection cut at a
	// handoff); bufio panics on a negative count.
	return max(n, 0), err
}

func (c *FileConn) keep(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, m := range msgs {
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if len(c.files) >= MaxFiles { // never more than MaxFiles held per connection
				unix.Close(fd)
				continue
			}
			unix.CloseOnExec(fd)
			c.files = append(c.files, os.NewFile(uintptr(fd), "passed-file"))
		}
	}
}

// TakeFile returns the descriptor the client passed, once; the caller owns
// (and closes) it. Without one it returns ErrNoFile.
func (c *FileConn) TakeFile() (*os.File, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.files) == 0 {
		return nil, ErrNoFile
	}
	f := c.files[0]
	c.files = c.files[1:]
	return f, nil
}

// ErrNoFile: a request said it carried a file, but none came.
var ErrNoFile = errors.New("api: the request says it carries a file, but no file descriptor came with it")

// Close closes the connection and every descriptor no handler took.
func (c *FileConn) Close() error {
	c.mu.Lock()
	for _, f := range c.files {
		f.Close()
	}
	c.files = nil
	c.mu.Unlock()
	return c.UnixConn.Close()
}

// FileListener makes every accepted connection a *FileConn.
type FileListener struct{ *net.UnixListener }

// Accept returns a *FileConn.
func (l FileListener) Accept() (net.Conn, error) {
	c, err := l.AcceptUnix()
	if err != nil {
		return nil, err
	}
	return NewFileConn(c), nil
}

// sendConn is the client's side: its first write carries f (SCM_RIGHTS),
// which it then closes (the agent holds its own copy).
type sendConn struct {
	*net.UnixConn
	f *os.File
}

func (c *sendConn) Write(b []byte) (int, error) {
	if c.f == nil {
		return c.UnixConn.Write(b)
	}
	n, _, err := c.UnixConn.WriteMsgUnix(b, unix.UnixRights(int(c.f.Fd())), nil)
	c.f.Close()
	c.f = nil
	if err != nil || n == len(b) {
		return n, err
	}
	m, err := c.UnixConn.Write(b[n:])
	return n + m, err
}

func (c *sendConn) Close() error {
	if c.f != nil {
		c.f.Close()
		c.f = nil
	}
	return c.UnixConn.Close()
}

// withFile returns an HTTP client for one request whose connection passes
// f; f is closed once sent (or when the request fails).
func (c *Client) withFile(f *os.File) *http.Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			conn, err := d.DialContext(ctx, "unix", c.Socket)
			if err != nil {
				f.Close()
				return nil, err
			}
			uc, ok := conn.(*net.UnixConn)
			if !ok {
				conn.Close()
				f.Close()
				return nil, fmt.Errorf("control socket %s is not a Unix socket", c.Socket)
			}
			return &sendConn{UnixConn: uc, f: f}, nil
		},
		DisableKeepAlives: true,
	}
	return &http.Client{Transport: tr}
}
