package logs

import (
	"strconv"
	"time"
	"unicode/utf8"
)

// Formats a Sink writes (Options.Format).
const (
	// FormatText prefixes every line with its time, app, slot and pid:
	//	2026-11-30T03:22:48.123Z [web 2 4242] message
	FormatText = "text"
	// FormatRaw writes the worker's text unchanged.
	FormatRaw = "raw"
	// FormatJSON writes one JSON object per line:
	//	{"time":"2026-11-30T03:22:48.123Z","app":"web","slot":2,"pid":4242,"stream":"out","msg":"message",
	//	 "service.name":"web","service.instance.id":"web/2","service.version":"v42","process.pid":4242}
	// The last four are OpenTelemetry's resource names, so the Collector's
	// filelog receiver maps them without a parser written by hand; they
	// come after the older keys, which keep their names and order
	// (service.version only when the worker runs a release).
	FormatJSON = "json"
	// FormatPM2JSON writes one JSON object per line with PM2's names (its
	// `--log-type json`), so shippers set up for PM2 read it unchanged:
	//	{"message":"message","timestamp":"2026-11-30T03:22:48.123Z","type":"out","process_id":2,"app_name":"web"}
	// process_id is the worker's slot (PM2's pm_id is per process); type
	// is "out", "err" or "deployd" (the Sink's own marker lines). Unlike
	// PM2, message has no trailing newline.
	FormatPM2JSON = "pm2-json"
	// formatJournald is the frame a journald File parses back into one
	// entry per line (Options.Target TargetJournal); never a file's.
	formatJournald = "journald"
)

// validFormat reports whether f is a format a Sink writes.
func validFormat(f string) bool {
	switch f {
	case FormatText, FormatRaw, FormatJSON, FormatPM2JSON:
		return true
	}
	return false
}

// TimeLayout is the timestamp of the text and json formats: RFC 3339 with
// milliseconds, always in UTC (so files from hosts in different zones sort and
// merge, and a DST change never makes time run backwards).
const TimeLayout = "2006-01-02T15:04:05.000Z07:00"

// markerStream is the stream of the marker lines the Sink itself writes
// (json format), so a reader can tell them from the worker's output.
const markerStream = "deployd"

// appendLine appends l, formatted as format, and a newline to b.
func appendLine(b []byte, format string, l *Line) []byte {
	switch format {
	case FormatRaw:
		b = append(b, l.Text...)
	case FormatJSON:
		b = append(b, `{"time":"`...)
		b = l.Time.UTC().AppendFormat(b, TimeLayout)
		b = append(b, `","app":`...)
		b = appendJSONString(b, l.App)
		b = append(b, `,"slot":`...)
		b = strconv.AppendInt(b, int64(l.Slot), 10)
		b = append(b, `,"pid":`...)
		b = strconv.AppendInt(b, int64(l.PID), 10)
		b = append(b, `,"stream":`...)
		b = appendJSONString(b, l.Stream)
		b = append(b, `,"msg":`...)
		b = appendJSONString(b, l.Text)
		b = appendOTel(b, l)
		b = append(b, '}')
	case FormatPM2JSON:
		b = append(b, `{"message":`...)
		b = appendJSONString(b, l.Text)
		b = append(b, `,"timestamp":"`...)
		b = l.Time.UTC().AppendFormat(b, TimeLayout)
		b = append(b, `","type":`...)
		b = appendJSONString(b, l.Stream)
		b = append(b, `,"process_id":`...)
		b = strconv.AppendInt(b, int64(l.Slot), 10)
		b = append(b, `,"app_name":`...)
		b = appendJSONString(b, l.App)
		b = append(b, '}')
	case formatJournald:
		b = appendFrame(b, l)
	default:
		b = l.Time.UTC().AppendFormat(b, TimeLayout)
		b = append(b, " ["...)
		if l.Stream == markerStream {
			b = append(b, markerStream...)
		} else {
			b = append(b, l.App...)
			b = append(b, ' ')
			b = strconv.AppendInt(b, int64(l.Slot), 10)
			b = append(b, ' ')
			b = strconv.AppendInt(b, int64(l.PID), 10)
		}
		b = append(b, "] "...)
		b = append(b, l.Text...)
	}
	return append(b, '\n')
}

// appendOTel appends OpenTelemetry's resource attributes of l's worker,
// by their semantic-convention names, to a JSON object being written.
func appendOTel(b []byte, l *Line) []byte {
	b = append(b, `,"service.name":`...)
	b = appendJSONString(b, l.App)
	b = append(b, `,"service.instance.id":`...)
	b = appendJSONString(b, l.App+"/"+strconv.Itoa(l.Slot))
	if l.Release != "" {
		b = append(b, `,"service.version":`...)
		b = appendJSONString(b, l.Release)
	}
	b = append(b, `,"process.pid":`...)
	return strconv.AppendInt(b, int64(l.PID), 10)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string. Invalid UTF-8 (a worker may
// print anything) becomes U+FFFD, as encoding/json does; unlike encoding/json
// it leaves <, > and & alone because the output is a log, not HTML.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i++
			start = i
			continue
		}
		// U+2028 and U+2029 are valid JSON but break JavaScript line parsing.
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, `\u202`...)
			b = append(b, hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

// markerLine is the line the Sink writes after it had to drop lines.
func markerLine(now time.Time, app string, dropped uint64, reason string) Line {
	return Line{
		Time:   now,
		App:    app,
		Slot:   -1,
		PID:    agentPID,
		Stream: markerStream,
		Text:   "deployd: dropped " + strconv.FormatUint(dropped, 10) + " lines (" + reason + ")",
	}
}
