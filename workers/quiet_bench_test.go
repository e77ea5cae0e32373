package workers

import (
	"io"
	"net"
	"slices"
	"testing"
	"time"
)

// BenchmarkQuietStop is the time the quiet phase adds to a worker's stop
// (median and p99 per stop), on a listener of this process with 10 idle
// kept-alive connections: "idle", nothing waits (one look at the kernel's
// tables); "request", a new connection's request is on its way as the
// phase starts, and a server goroutine accepts and answers it.
//
//	go test -run '^$' -bench BenchmarkQuietStop -benchtime 200x ./workers
func BenchmarkQuietStop(b *testing.B) {
	for _, inFlight := range []bool{false, true} {
		name := map[bool]string{false: "idle", true: "request"}[inFlight]
		b.Run(name, func(b *testing.B) {
			l, err := net.ListenTCP("tcp4", &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)})
			if err != nil {
				b.Fatal(err)
			}
			defer l.Close()
			go serveKept(l)
			for range 10 {
				c := dialAsk(b, l)
				if _, err := io.ReadFull(c, make([]byte, len(keptAnswer))); err != nil {
					b.Fatal(err)
				}
				defer c.Close()
			}
			ports := map[uint16]bool{uint16(l.Addr().(*net.TCPAddr).Port): true}
			took := make([]time.Duration, 0, b.N)
			b.ResetTimer()
			for range b.N {
				var c net.Conn
				if inFlight {
					c = dialAsk(b, l)
				}
				r := awaitQuiet(self, ports, 10*time.Second, nil)
				if r.Outcome != quietDone {
					b.Fatalf("%+v", r)
				}
				took = append(took, r.Waited)
				if c != nil {
					c.Close()
				}
			}
			slices.Sort(took)
			b.ReportMetric(float64(took[len(took)/2].Microseconds()), "median-µs/stop")
			b.ReportMetric(float64(took[min(len(took)-1, len(took)*99/100)].Microseconds()), "p99-µs/stop")
		})
	}
}

const keptAnswer = "HTTP/1.1 204 No Content\r\n\r\n"

// serveKept accepts on l and answers each 18-byte request at once,
// keeping the connection open; it returns when l closes.
func serveKept(l *net.TCPListener) {
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 18)
			for {
				if _, err := io.ReadFull(c, buf); err != nil {
					return
				}
				if _, err := c.Write([]byte(keptAnswer)); err != nil {
					return
				}
			}
		}()
	}
}

// dialAsk connects to l and sends one request.
func dialAsk(b *testing.B, l *net.TCPListener) net.Conn {
	c, err := net.DialTimeout("tcp4", l.Addr().String(), 5*time.Second)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := c.Write([]byte("GET / HTTP/1.1\r\n\r\n")); err != nil {
		b.Fatal(err)
	}
	return c
}
