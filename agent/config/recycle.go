package config

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// recycleParser reads recycle_at: crontab's five fields (minute hour
// day-of-month month day-of-week), an optional leading seconds field as
// PM2's cron_restart takes, the descriptors @hourly, @daily, @weekly,
// @monthly and @yearly, and an optional "CRON_TZ=Zone " prefix.
var recycleParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// maxRecycleAt bounds the text: a schedule is a line.
const maxRecycleAt = 256

// ParseRecycleAt parses a recycle_at schedule. A worker falls due once a
// time of the schedule has come since it started (Schedule.Next of its
// start is past). The error says what is wrong, without the fix (the
// caller adds it).
func ParseRecycleAt(s string) (sched cron.Schedule, err error) {
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return nil, errors.New("empty")
	case len(s) > maxRecycleAt:
		return nil, fmt.Errorf("%d bytes long", len(s))
	case strings.HasPrefix(s, "@every"):
		return nil, errors.New("@every is an interval, not a time of day")
	}
	if zone, ok := strings.CutPrefix(s, "CRON_TZ="); ok || strings.HasPrefix(s, "TZ=") {
		if !ok {
			zone = strings.TrimPrefix(s, "TZ=")
		}
		// The parser indexes the space after the zone without checking
		// that there is one.
		if !strings.Contains(zone, " ") {
			return nil, errors.New("a time zone without a schedule after it")
		}
	}
	defer func() {
		// The agent parses its config: a schedule must never end it.
		if r := recover(); r != nil {
			sched, err = nil, fmt.Errorf("not a schedule (%v)", r)
		}
	}()
	sched, err = recycleParser.Parse(s)
	if err != nil {
		return nil, err
	}
	if sched.Next(time.Now()).IsZero() {
		return nil, errors.New("never comes (no such date in the next five years)")
	}
	return sched, nil
}
