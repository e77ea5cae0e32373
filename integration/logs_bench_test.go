package integration

import (
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/deployd/deployd/agent/api"
)

// BenchmarkLogsThroughput measures the log path: worker stdout → pipe →
// agent (capture, sink, format, rotation) → files, with
//
//	go test ./integration -run '^$' -bench Logs -benchtime 1x -v
//
// burst: 4 requests GET /log?n=1000000 at once on 4 workers, each worker
// printing as fast as it can, which is faster than the agent writes: the
// figure is the agent's ceiling, and what it could not keep is dropped.
// paced: 100 requests/s of 1000 lines (100 000 lines/s) for 3 s, the agent's
// CPU at a steady, heavy but sustainable rate.
//
// Reported: lines/s and MB/s reaching the files (MB/s of the files, which
// hold a 40-byte prefix per line, and of the workers' text), lines dropped,
// and the agent's CPU (utime+stime from /proc) as a share of one core.
func BenchmarkLogsThroughput(b *testing.B) {
	for _, sc := range []struct {
		name     string
		rate     int // requests per second; 0: all at once
		requests int
		lines    int // per request
	}{
		{"burst", 0, 4, 1_000_000},
		{"paced", 100, 300, 1000},
	} {
		b.Run(sc.name, func(b *testing.B) {
			for range b.N {
				runLogsBench(b, sc.rate, sc.requests, sc.lines)
			}
		})
	}
}

func runLogsBench(b *testing.B, rate, requests, lines int) {
	port := FreePort(b)
	a := StartAgent(b, bins, appConfig("web", port, 4, `[apps.web.logs]
max_size = "64MiB"
max_files = 1000
`))
	a.WaitFor("4 ready", 30*time.Second, func(st *api.Status) bool { return AllReady(st, "web", 4) })
	logDir := filepath.Join(a.Dir, "logs")
	size0 := logBytes(b, logDir)
	cpu0 := procCPU(b, a.PID())
	t0 := time.Now()

	var wg sync.WaitGroup
	errs := make(chan error, requests)
	var tick <-chan time.Time
	if rate > 0 {
		tk := time.NewTicker(time.Second / time.Duration(rate))
		defer tk.Stop()
		tick = tk.C
	}
	for range requests {
		if tick != nil {
			<-tick
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := getLong(port, fmt.Sprintf("/log?n=%d", lines)); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatalf("GET /log: %v", err)
	}
	end, last := waitLogsSettled(b, logDir)
	cpu := procCPU(b, a.PID()) - cpu0
	elapsed := end.Sub(t0)

	c := newSpamCount("log", lines)
	c.read(b, logFilesOf(b, logDir, "web.out"))
	written := c.total
	dropped := appOf(a.Status(), "web").DroppedLogLines
	offered := requests * lines
	if uint64(written)+dropped != uint64(offered) {
		b.Errorf("%d lines written + %d dropped != %d printed", written, dropped, offered)
	}
	sec := elapsed.Seconds()
	b.ReportMetric(float64(written)/sec, "lines/s")
	b.ReportMetric(float64(last-size0)/sec/1e6, "file-MB/s")
	b.ReportMetric(float64(c.texts)/sec/1e6, "text-MB/s")
	b.ReportMetric(float64(dropped), "dropped")
	b.ReportMetric(100*cpu.Seconds()/sec, "agent-cpu-%")
	b.Logf("%d of %d lines written (%d dropped) in %s by %d workers; files %.1f MB; agent CPU %s",
		written, offered, dropped, elapsed.Round(time.Millisecond), len(c.seen), float64(last-size0)/1e6, cpu)
	if len(c.extra) > 0 && rate == 0 && len(c.seen) == requests {
		b.Errorf("%d lines written twice", len(c.extra))
	}
}

// getLong is get for requests that may take long, without a *testing.T.
func getLong(port int, path string) (string, error) {
	c := &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get(fmt.Sprintf("http://127.0.0.1:%d%s", port, path))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return string(body), fmt.Errorf("status %s", resp.Status)
	}
	return string(body), err
}
