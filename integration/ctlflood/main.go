// Command ctlflood opens many keep-alive connections to a deployd control
// socket, as a misbehaving client would, and keeps those the agent let it
// keep until its stdin closes. The connection-limit test runs it as a
// socket_group member (SO_PEERCRED is the connecting process's uid).
//
// Each connection asks GET /v1/version once and keeps the connection idle.
// Once every connection has been tried it prints one JSON line of counts
// (kept, refused with the agent's 503, closed unanswered, failed to
// connect or timed out, plus the first refusal's text) and waits for stdin
// to close; then it closes everything and exits.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"sync"
	"time"
)

type counts struct {
	Kept, Refused, Closed, Failed int
	Refusal                       string
	FirstError                    string
}

func main() {
	socket := flag.String("socket", "", "control socket")
	n := flag.Int("n", 1000, "connections to open")
	par := flag.Int("parallel", 64, "connections opened at once")
	timeout := flag.Duration("timeout", 2*time.Second, "deadline of each connection's request")
	flag.Parse()

	var (
		mu   sync.Mutex
		c    counts
		kept []net.Conn
		wg   sync.WaitGroup
	)
	sem := make(chan struct{}, *par)
	for range *n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			conn, status, body, err := ask(*socket, *timeout)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && status == http.StatusOK:
				c.Kept++
				kept = append(kept, conn)
				return
			case err == nil && status == http.StatusServiceUnavailable:
				c.Refused++
				if c.Refusal == "" {
					c.Refusal = body
				}
			case err != nil && conn != nil: // connected; closed or timed out before an answer
				c.Closed++
				if c.FirstError == "" {
					c.FirstError = err.Error()
				}
			default:
				c.Failed++
				if c.FirstError == "" && err != nil {
					c.FirstError = err.Error()
				}
			}
			if conn != nil {
				conn.Close()
			}
		})
	}
	wg.Wait()
	b, _ := json.Marshal(c)
	fmt.Println(string(b))
	_, _ = io.Copy(io.Discard, os.Stdin) // hold until the test closes stdin
	for _, k := range kept {
		k.Close()
	}
}

// ask connects, sends one keep-alive request and reads its answer.
func ask(socket string, timeout time.Duration) (net.Conn, int, string, error) {
	conn, err := net.DialTimeout("unix", socket, timeout)
	if err != nil {
		return nil, 0, "", err
	}
	_ = conn.SetDeadline(time.Now().Add(timeout))
	if _, err := io.WriteString(conn, "GET /v1/version HTTP/1.1\r\nHost: deployd\r\n\r\n"); err != nil {
		return conn, 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return conn, 0, "", err
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	resp.Body.Close()
	_ = conn.SetDeadline(time.Time{})
	return conn, resp.StatusCode, strings.TrimSpace(string(b)), nil
}
