package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

// memoryScrapes is how many metrics scrapes and status calls the agent
// answers before its RSS is read the second time.
const memoryScrapes = 20

// memoryIdle is how long the manager idles between its two idle readings:
// a manager whose idle loop makes garbage grows until the GC's goal (an
// agent that did grew by ~15 KiB/s, to 15.3 MiB after 3 minutes), which a
// reading right after the start does not show.
const memoryIdle = 45 * time.Second

// memory measures the manager's RSS with two apps of b.instances Node workers
// each: the deployd agent with metrics on, against PM2's daemon, each idle
// once settled; deployd's again after memoryScrapes scrapes and status
// calls, split into file-backed (its binary) and anonymous memory.
func (b *bench) memory(ctx context.Context) error {
	node := appSpec{kind: "node", instances: b.instances, extraApps: 1}
	for rep := range b.repeats {
		b.logf("manager memory (2 apps), repeat %d/%d", rep+1, b.repeats)
		mport, err := freePort()
		if err != nil {
			return err
		}
		ss := []system{&deploydSystem{b: b, label: sysDeployd, app: node, metrics: mport}}
		if b.pm2 != "" {
			ss = append(ss, &pm2System{b: b, app: node})
		}
		for _, sys := range rotate(ss, rep) {
			err := b.withSystem(ctx, sys, func() error {
				time.Sleep(2 * time.Second)
				pid := sys.managerPID()
				r, err := settledRSS(ctx, pid)
				if err != nil {
					return err
				}
				b.res.add("memory", sys.name(), "idle_rss", rep, float64(r))
				select {
				case <-ctx.Done():
					return ctx.Err()
				case <-time.After(memoryIdle):
				}
				if r, err = rss(pid); err != nil {
					return err
				}
				b.res.add("memory", sys.name(), "idle_later_rss", rep, float64(r))
				d, ok := sys.(*deploydSystem)
				if !ok {
					return nil
				}
				for range memoryScrapes {
					if err := scrapeOnce(ctx, d.metrics); err != nil {
						return err
					}
					if _, err := d.client.Status(ctx, ""); err != nil {
						return err
					}
				}
				if r, err = settledRSS(ctx, pid); err != nil {
					return err
				}
				b.res.add("memory", sys.name(), "scraped_rss", rep, float64(r))
				anon, file, err := rssSplit(pid)
				if err != nil {
					return err
				}
				b.res.add("memory", sys.name(), "rss_anon", rep, float64(anon))
				b.res.add("memory", sys.name(), "rss_file", rep, float64(file))
				b.logf("    %s: RSS %.1f MiB (anon %.1f, file %.1f)", sys.name(), float64(r)/mib, float64(anon)/mib, float64(file)/mib)
				return nil
			})
			if err != nil {
				return err
			}
		}
	}
	return nil
}

func scrapeOnce(ctx context.Context, port int) error {
	req, err := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("http://127.0.0.1:%d/metrics", port), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("scrape: %w", err)
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil || resp.StatusCode != http.StatusOK {
		return fmt.Errorf("scrape: %s %v", resp.Status, err)
	}
	return nil
}

// rssSplit reads RssAnon and RssFile of pid, in bytes.
func rssSplit(pid int) (anon, file int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		k, v, _ := strings.Cut(sc.Text(), ":")
		fs := strings.Fields(v)
		if len(fs) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(fs[0], 10, 64)
		switch k {
		case "RssAnon":
			anon = n << 10
		case "RssFile":
			file = n << 10
		}
	}
	return anon, file, sc.Err()
}

func (b *bench) reportMemory(w io.Writer) {
	r := &b.res
	if len(r.vals("memory", sysDeployd, "idle_rss")) == 0 {
		return
	}
	fmt.Fprintf(w, "### Manager memory, 2 apps × %d Node workers (deployd: metrics on)\n\n", b.instances)
	t := &table{head: []string{"manager", "RSS idle, MiB", fmt.Sprintf("RSS idle %v later, MiB", memoryIdle),
		fmt.Sprintf("RSS after %d scrapes + status calls, MiB", memoryScrapes),
		"of which anonymous, MiB", "of which file-backed (the binary), MiB"}}
	t.row("deployd agent", mmm(scale(r.vals("memory", sysDeployd, "idle_rss"), mib), "%.1f"),
		mmm(scale(r.vals("memory", sysDeployd, "idle_later_rss"), mib), "%.1f"),
		mmm(scale(r.vals("memory", sysDeployd, "scraped_rss"), mib), "%.1f"),
		mmm(scale(r.vals("memory", sysDeployd, "rss_anon"), mib), "%.1f"),
		mmm(scale(r.vals("memory", sysDeployd, "rss_file"), mib), "%.1f"))
	if b.pm2 != "" {
		t.row("PM2 daemon", mmm(scale(r.vals("memory", sysPM2, "idle_rss"), mib), "%.1f"),
			mmm(scale(r.vals("memory", sysPM2, "idle_later_rss"), mib), "%.1f"), "–", "–", "–")
	}
	fmt.Fprintln(w, t)
	if vs := r.ratio("memory", sysDeployd, "idle_rss", "memory", sysPM2, "idle_rss"); len(vs) > 0 {
		fmt.Fprintf(w, "deployd agent RSS / PM2 daemon RSS, idle, 2 apps: %s.\n\n", mmm(vs, "%.2f"))
	}
}
