package release

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// pipeSource is the read end of a pipe never written, as the agent reads
// a client's stream; the write end stays open until the test ends.
func pipeSource(t *testing.T, idle time.Duration) Source {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { w.Close() })
	p, err := Pollable(r)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return Source{File: p, Kind: KindTarball, Name: "app.tar.gz", Idle: idle}
}

// A client that passes a pipe and never writes it does not hold the
// install (and the app's lock) past the idle deadline.
func TestInstallFromPipeNeverWrittenStalls(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	src := pipeSource(t, 200*time.Millisecond)
	var err error
	t0 := time.Now()
	returnsWithin(t, "InstallFrom of a pipe never written", func() { _, err = s.InstallFrom("web", src, "1.0.0", "") })
	var re *RefusedError
	if !errors.As(err, &re) || re.Problem != Stalled {
		t.Fatalf("InstallFrom = %v; want a Stalled refusal", err)
	}
	if took := time.Since(t0); took < 200*time.Millisecond {
		t.Errorf("refused after %s, before the idle deadline", took)
	}
	if ents, _ := os.ReadDir(filepath.Join(s.Dir, "web")); len(ents) != 0 {
		t.Errorf("left behind: %v", ents)
	}
}

// Closing the stream (the agent does when the client hangs up) ends a
// read that waits, whatever the idle deadline.
func TestInstallFromEndsWhenTheStreamIsClosed(t *testing.T) {
	s := &Store{Dir: t.TempDir()}
	src := pipeSource(t, time.Hour)
	done := make(chan error, 1)
	go func() { _, err := s.InstallFrom("web", src, "1.0.0", ""); done <- err }()
	src.File.Close()
	select {
	case err := <-done:
		if err == nil {
			t.Fatal("InstallFrom of a closed stream succeeded")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("InstallFrom still reads 10s after its stream was closed")
	}
}

// A device is not a stream of an artifact.
func TestPollableRefusesDevices(t *testing.T) {
	f, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var re *RefusedError
	if _, err := Pollable(f); !errors.As(err, &re) || re.Problem != NotRegular {
		t.Errorf("Pollable(/dev/zero) = %v; want a NotRegular refusal", err)
	}
}
