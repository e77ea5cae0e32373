package logs

import "fmt"

// A Sink of TargetBoth writes the files, and has a twin Sink that writes
// the journal: a journaled capture writes each batch to both, each with
// its own lane in the worker's journal (Journal), so that a line lands
// once in each place across an agent SIGKILL.

// lanes are the Sinks a journaled capture writes each batch to, in the
// order of its journal's lanes: this one, then its twin if it has one. A
// nil Sink has one lane, writing nowhere.
func (s *Sink) lanes() []*Sink {
	if s == nil {
		return []*Sink{nil}
	}
	if t := s.twin.Load(); t != nil {
		return []*Sink{s, t}
	}
	return []*Sink{s}
}

// Reconfigure writes what is queued, then goes on with o's Target,
// Format, MaxSize, MaxFiles, MaxAge and Compress (a reload that changed
// [apps.NAME.logs]); the path, buffers and logger stay. TargetBoth opens
// a twin for the journal, another target closes it. On error the
// previous settings stay in force.
func (s *Sink) Reconfigure(o Options) error {
	s.reconf.Lock()
	defer s.reconf.Unlock()
	old := s.twin.Load()
	if o.Target != TargetBoth {
		if err := s.reconfigure(o); err != nil {
			return err
		}
		if old != nil {
			s.twin.Store(nil)
			return old.Close()
		}
		return nil
	}
	o.Target = TargetFiles
	twin := old
	if twin == nil {
		var err error
		if twin, err = OpenSink(s.twinOptions()); err != nil {
			return fmt.Errorf("logs: reconfigure %s: %w", s.opts.Path, err)
		}
	}
	if err := s.reconfigure(o); err != nil {
		if old == nil {
			_ = twin.Close()
		}
		return err
	}
	s.twin.Store(twin)
	return nil
}

// openBoth opens a Sink of TargetBoth: the files, with a twin Sink for the
// journal.
func openBoth(o Options) (*Sink, error) {
	o.Target = TargetFiles
	s, err := OpenSink(o)
	if err != nil {
		return nil, err
	}
	t, err := OpenSink(s.twinOptions())
	if err != nil {
		_ = s.Close()
		return nil, err
	}
	s.twin.Store(t)
	return s, nil
}

// twinOptions are the options of s's twin: the journal, with s's path (to
// name it in messages), buffers and logger.
func (s *Sink) twinOptions() Options {
	return Options{Path: s.opts.Path, Target: TargetJournal, BufferLines: s.opts.BufferLines,
		BufferBytes: s.opts.BufferBytes, Logger: s.opts.Logger}
}

// toJournal tells whether s writes to the systemd journal now (its target
// may have changed since OpenSink: Reconfigure).
func (s *Sink) toJournal() bool { return s.journald.Load() }
