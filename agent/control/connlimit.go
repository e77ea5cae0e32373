package control

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/go-hclog"
	"golang.org/x/sys/unix"

	"github.com/deployd/deployd/agent/api"
)

// Control connections are capped so that no client can take the file
// descriptors the supervisors need to restart workers, open logs and pass
// sockets: 20 000 idle keep-alive connections of one socket_group member
// once took an agent to its RLIMIT_NOFILE, and a killed worker could not be
// restarted ("too many open files"). A connection is counted from Accept to
// its close, by the uid the kernel reports for it (SO_PEERCRED):
//
//   - each uid other than root and the agent's own uid holds at most PerUID;
//   - all of those together hold at most Others;
//   - root and the agent's uid have a reserve of their own, Owners, that no
//     other uid can take: root can always run status, stop, restart and
//     shutdown.
//
// A connection over its limit is answered 503 with a message naming the
// limit (at most refusers of them at once, each within refuseTimeout; beyond
// that it is closed unanswered) and closed. Idle keep-alive connections
// close after controlIdleTimeout.
type connLimits struct {
	PerUID, Others, Owners int
}

const (
	// controlIdleTimeout closes a keep-alive connection that sent nothing
	// for that long. The client's own (api.Client) is shorter, so that it
	// drops an idle connection before the agent does.
	controlIdleTimeout = 2 * time.Minute
	// controlBodyTimeout bounds the read of a request's body.
	controlBodyTimeout = 30 * time.Second
	// refuseTimeout bounds the answer to a refused connection.
	refuseTimeout = time.Second
	// refusers is how many refused connections are answered at once.
	refusers = 16
)

// limitsFor derives the caps from the agent's RLIMIT_NOFILE: members and
// owners may each hold nofile/32 (at least 8, at most 256): clients never
// hold more than an eighth of it, refusals included, once it is 1024 or more.
func limitsFor(nofile uint64) connLimits {
	part := int(min(nofile/32, 256))
	part = max(part, 8)
	return connLimits{PerUID: min(max(part/4, 4), 64), Others: part, Owners: part}
}

// raiseNoFile raises the soft RLIMIT_NOFILE to the hard one and returns it.
// Go's runtime already does this at start on Linux (and gives children the
// original soft limit back); this catches the case it leaves (soft = hard - 1)
// and reads the figure the control limits are derived from.
func raiseNoFile() (uint64, error) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		return 0, err
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			return 0, err
		}
	}
	return lim.Cur, nil
}

// connLimiter is a listener that counts connections by uid and refuses
// those over the limits. Safe for concurrent use; its mutex is taken in
// leaf methods only.
type connLimiter struct {
	net.Listener
	lim   connLimits
	owner func(uid int) bool
	log   hclog.Logger

	mu     sync.Mutex
	byUID  map[int]int
	uidOf  map[net.Conn]int // open counted connections
	others int
	owners int

	refusing chan struct{} // a token per refusal being answered
	wg       sync.WaitGroup
	logRate  rateLog
}

func newConnLimiter(l net.Listener, lim connLimits, owner func(uid int) bool, log hclog.Logger) *connLimiter {
	return &connLimiter{Listener: l, lim: lim, owner: owner, log: log, byUID: map[int]int{}, uidOf: map[net.Conn]int{},
		refusing: make(chan struct{}, refusers), logRate: rateLog{every: 10 * time.Second}}
}

// Accept returns the next connection within the limits; it answers and
// closes the others itself.
func (l *connLimiter) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		uid := peerUID(c)
		why := l.take(c, uid)
		if why == "" {
			return c, nil
		}
		l.refuse(c, uid, why)
	}
}

// Close closes the listener and waits for the refusals being answered.
func (l *connLimiter) Close() error {
	err := l.Listener.Close()
	l.wg.Wait()
	return err
}

// take counts c for uid, or says which limit it is over.
func (l *connLimiter) take(c net.Conn, uid int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.owner(uid) {
		if l.owners >= l.lim.Owners {
			return fmt.Sprintf("root and the agent's uid hold %d control connections, their limit", l.owners)
		}
		l.owners++
	} else {
		switch {
		case l.byUID[uid] >= l.lim.PerUID:
			return fmt.Sprintf("uid %d holds %d control connections, the limit per uid", uid, l.byUID[uid])
		case l.others >= l.lim.Others:
			return fmt.Sprintf("users other than root hold %d control connections, their limit together", l.others)
		}
		l.others++
		l.byUID[uid]++
	}
	l.uidOf[c] = uid
	return ""
}

// track gives back c's place when it closes (http.Server.ConnState).
func (l *connLimiter) track(c net.Conn, s http.ConnState) {
	if s != http.StateClosed && s != http.StateHijacked {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	uid, ok := l.uidOf[c]
	if !ok {
		return
	}
	delete(l.uidOf, c)
	if l.owner(uid) {
		l.owners--
		return
	}
	l.others--
	if l.byUID[uid]--; l.byUID[uid] == 0 {
		delete(l.byUID, uid)
	}
}

// counts returns the connections held by uid, by all but the owners, and
// by the owners.
func (l *connLimiter) counts(uid int) (byUID, others, owners int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.byUID[uid], l.others, l.owners
}

// refuse answers c with 503 and why, then closes it; without a free
// refuser it closes c at once.
func (l *connLimiter) refuse(c net.Conn, uid int, why string) {
	if ok, skipped := l.logRate.allow(time.Now()); ok {
		l.log.Warn("control connection refused", "uid", uid, "reason", why, "refused_before_unlogged", skipped)
	}
	select {
	case l.refusing <- struct{}{}:
	default:
		c.Close()
		return
	}
	l.wg.Go(func() {
		defer func() { <-l.refusing }()
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(refuseTimeout))
		// The request is read first, so that the client reads the answer
		// as the answer to it (a response before any request is dropped by
		// Go's transport as unsolicited).
		br := bufio.NewReader(io.LimitReader(c, 64<<10))
		if req, err := http.ReadRequest(br); err == nil {
			_, _ = io.Copy(io.Discard, io.LimitReader(req.Body, api.MaxRequestBytes))
		}
		_, _ = io.WriteString(c, limitRefusal(why))
	})
}

// limitRefusal is the raw HTTP answer to a refused connection.
func limitRefusal(why string) string {
	b, _ := json.Marshal(api.Error{Kind: api.KindLimited, Error: "too many control connections: " + why +
		"; the agent refused this one and did nothing. Close connections you keep open (an idle one closes after " +
		controlIdleTimeout.String() + ") and ask again"})
	var s strings.Builder
	s.WriteString("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n")
	fmt.Fprintf(&s, "Content-Length: %d\r\n\r\n", len(b)+1)
	s.Write(b)
	s.WriteString("\n")
	return s.String()
}

// peerUID is the uid of c's peer (SO_PEERCRED); -1 when unknown.
func peerUID(c net.Conn) int {
	sc, ok := c.(syscall.Conn)
	if !ok {
		return -1
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return -1
	}
	uid := -1
	_ = raw.Control(func(fd uintptr) {
		if cred, err := unix.GetsockoptUcred(int(fd), unix.SOL_SOCKET, unix.SO_PEERCRED); err == nil {
			uid = int(cred.Uid)
		}
	})
	return uid
}

// rateLog lets a log line through at most once per every; it counts the
// ones it held back. Safe for concurrent use.
type rateLog struct {
	every time.Duration

	mu      sync.Mutex
	last    time.Time
	skipped int
}

// allow says whether to log now, and how many were held back since the
// last one that was.
func (r *rateLog) allow(now time.Time) (bool, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.skipped++
		return false, 0
	}
	n := r.skipped
	r.last, r.skipped = now, 0
	return true, n
}
