package config

import (
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode"

	"github.com/robfig/cron/v3"
)

// recycleParser reads recycle_at: crontab's five fields (minute hour
// day-of-month month day-of-week), an optional leading seconds field as
// PM2's cron_restart takes, the descriptors @hourly, @daily, @weekly,
// @monthly and @yearly, and an optional "CRON_TZ=Zone " prefix.
var recycleParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

const (
	// maxRecycleAt bounds the text: a schedule is a line.
	maxRecycleAt = 256
	// minRecycleGap is the least time between two times of a schedule:
	// closer, the pool would never stop being replaced.
	minRecycleGap = 10 * time.Second
)

// ParseRecycleAt parses a recycle_at schedule. A worker falls due once a
// time of the schedule has come since it started (Schedule.Next of its
// start is past). The error says what is wrong, without the fix (the
// caller adds it).
func ParseRecycleAt(s string) (cron.Schedule, error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return nil, errors.New("empty")
	case len(s) > maxRecycleAt:
		return nil, fmt.Errorf("%d bytes long", len(s))
	}
	// The zone is cut off here: the parser indexes the space after it
	// without checking there is one, and reads a tab as part of it.
	zone := ""
	for _, p := range []string{"CRON_TZ=", "TZ="} {
		rest, ok := strings.CutPrefix(s, p)
		if !ok {
			continue
		}
		i := strings.IndexFunc(rest, unicode.IsSpace)
		if i < 0 {
			return nil, errors.New("a time zone without a schedule after it")
		}
		zone, s = rest[:i], strings.TrimSpace(rest[i:])
		if zone == "" {
			return nil, fmt.Errorf("%s names no time zone", p)
		}
		if _, err := time.LoadLocation(zone); err != nil {
			return nil, fmt.Errorf("unknown time zone %q (zones come from this host's tz database, /usr/share/zoneinfo, Debian's tzdata package)", zone)
		}
		break
	}
	if strings.HasPrefix(s, "@every") {
		return nil, errors.New("@every is an interval, not a time of day")
	}
	if zone != "" {
		s = "CRON_TZ=" + zone + " " + s
	}
	sched, err := parseSchedule(s)
	if err != nil {
		return nil, err
	}
	at := sched.Next(time.Now())
	if at.IsZero() {
		return nil, errors.New("never comes (no such date in the next five years)")
	}
	for range 10 {
		next := sched.Next(at)
		if next.IsZero() {
			break
		}
		if gap := next.Sub(at); gap < minRecycleGap {
			return nil, fmt.Errorf("its times come %s apart, less than %s: the pool would never stop being replaced", gap, minRecycleGap)
		}
		at = next
	}
	return sched, nil
}

// parseSchedule is the parser's Parse, with a panic made an error: the
// agent parses its config, and a schedule must never end it.
func parseSchedule(s string) (sched cron.Schedule, err error) {
	defer func() {
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("the cron parser failed (%v)", r)
		}
	}()
	return recycleParser.Parse(s)
}
