package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"sort"
	"sync"

	"github.com/deployd/deployd/internal/atomicfile"
	"github.com/deployd/deployd/internal/boundedfile"
)

// stateVersion is the format of state.json.
const stateVersion = 1

// AppState is what the agent must bring back for an app after a restart, a
// handoff or a reboot.
type AppState struct {
	Current  string   `json:"current,omitempty"`  // release serving
	Previous string   `json:"previous,omitempty"` // release before it (rollback target)
	Failed   []string `json:"failed,omitempty"`   // releases whose deploy failed
	// Instances overrides the config's count when > 0 (deployd scale).
	Instances int  `json:"instances,omitempty"`
	Stopped   bool `json:"stopped,omitempty"` // deployd stop
	// Learned are the addresses an app without a listen list serves, as
	// its workers' own binds asked for them (learn.go); Listen is the
	// first of them, as agents before Learned read it.
	Learned []string `json:"learned,omitempty"`
	Listen  string   `json:"listen,omitempty"`
}

// learnedOf returns the addresses st says its app learned.
func learnedOf(st AppState) []string {
	if len(st.Learned) == 0 && st.Listen != "" {
		return []string{st.Listen} // written by an agent before Learned
	}
	return st.Learned
}

// setLearned makes st name addrs as its app's learned addresses.
func setLearned(st *AppState, addrs []string) {
	st.Learned, st.Listen = addrs, ""
	if len(addrs) > 0 {
		st.Listen = addrs[0]
	}
}

// stateFile is state_dir/state.json. Safe for concurrent use; every change
// is written atomically (temp file, fsync, rename, fsync of the folder).
type stateFile struct {
	path string

	mu   sync.Mutex
	apps map[string]*AppState
}

type stateDoc struct {
	Version int                  `json:"version"`
	Apps    map[string]*AppState `json:"apps"`
}

// maxStateFile bounds state.json: a few hundred bytes an app.
const maxStateFile = 64 << 20

// loadState reads dir/state.json, following no link on its path.
func loadState(dir string) (*stateFile, error) {
	s := &stateFile{path: filepath.Join(dir, "state.json"), apps: map[string]*AppState{}}
	b, err := boundedfile.ReadFile(s.path, boundedfile.Options{Max: maxStateFile, NoSymlinks: true})
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read state: %w", err)
	}
	var doc stateDoc
	if err := json.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("state file %s is damaged (%v); move it away to start from the config alone", s.path, err)
	}
	if doc.Apps != nil {
		s.apps = doc.Apps
	}
	return s, nil
}

// get returns a copy of app's state.
func (s *stateFile) get(app string) AppState {
	s.mu.Lock()
	defer s.mu.Unlock()
	if st := s.apps[app]; st != nil {
		c := *st
		c.Failed = append([]string(nil), st.Failed...)
		return c
	}
	return AppState{}
}

// update changes app's state with fn and writes the file. If the write
// fails the change is undone.
func (s *stateFile) update(app string, fn func(*AppState)) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	old := s.apps[app]
	st := AppState{}
	if old != nil {
		st = *old
		st.Failed = append([]string(nil), old.Failed...)
	}
	fn(&st)
	s.apps[app] = &st
	if err := s.writeLocked(); err != nil {
		if old == nil {
			delete(s.apps, app)
		} else {
			s.apps[app] = old
		}
		return err
	}
	return nil
}

// forget drops the run-time overrides of an app that left the config (its
// scaled count and `deployd stop`), so that an app of that name added later
// starts from its config; its releases (current, previous, failed) stay.
func (s *stateFile) forget(app string) error {
	s.mu.Lock()
	st := s.apps[app]
	s.mu.Unlock()
	if st == nil || (st.Instances == 0 && !st.Stopped) {
		return nil
	}
	return s.update(app, func(st *AppState) { st.Instances, st.Stopped = 0, false })
}

// names returns the apps the file holds.
func (s *stateFile) names() []string {
	s.mu.Lock()
	names := make([]string, 0, len(s.apps))
	for n := range s.apps {
		names = append(names, n)
	}
	s.mu.Unlock()
	sort.Strings(names)
	return names
}

func (s *stateFile) writeLocked() error {
	b, err := json.MarshalIndent(stateDoc{Version: stateVersion, Apps: s.apps}, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFileNoSymlinks(s.path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("write state: %w", err)
	}
	return nil
}
