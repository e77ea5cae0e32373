package integration

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// promote and abort while deploy --canary still starts its canary say so
// (not "holds no canary"); a promote that succeeded is logged as done, at
// INFO.
func TestCanaryStartingWords(t *testing.T) {
	parallel(t)
	port := FreePort(t)
	a := StartAgent(t, bins, releasesApp(port, 2))
	if r := a.CLIWithin(60*time.Second, "deploy", "web", "--artifact", artifactDir(t, "1.0.0", false), "--version", "1.0.0"); r.Code != 0 {
		t.Fatalf("deploy 1.0.0: exit %d\n%s", r.Code, r.Stderr)
	}
	// 2.0.0 gets ready once the gate file exists.
	gate := filepath.Join(t.TempDir(), "gate")
	dir := artifactDir(t, "2.0.0", false)
	if err := os.WriteFile(filepath.Join(dir, "run"), []byte("#!/bin/sh\nexec ./server -version 2.0.0 -ready-file "+gate+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	deployed := make(chan Result, 1)
	go func() {
		deployed <- a.CLIWithin(90*time.Second, "deploy", "web", "--artifact", dir, "--version", "2.0.0", "--canary", "1")
	}()
	deadline := time.Now().Add(30 * time.Second)
	for starting := false; !starting; {
		for _, w := range appOf(a.Status(), "web").Workers {
			starting = starting || w.Release == "2.0.0" && w.State == "starting"
		}
		if time.Now().After(deadline) {
			t.Fatal("no worker of 2.0.0 started within 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	for _, verb := range []string{"promote", "abort"} {
		r := a.CLIWithin(30*time.Second, verb, "web")
		if r.Code == 0 || !strings.Contains(r.Stderr, "canary starting (slot 0 not ready yet)") || strings.Contains(r.Stderr, "holds no canary") {
			t.Errorf("%s while the canary starts: exit %d, want a refusal saying the canary starts\n%s", verb, r.Code, r.Stderr)
		}
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if r := <-deployed; r.Code != 0 {
		t.Fatalf("deploy 2.0.0 --canary 1: exit %d\n%s", r.Code, r.Stderr)
	}
	if r := a.CLIWithin(60*time.Second, "promote", "web"); r.Code != 0 {
		t.Fatalf("promote: exit %d\n%s", r.Code, r.Stderr)
	}
	line := waitLogLine(t, a, "the promote's outcome", "operation done: op=promote", "app=web", "outcome=promoted")
	if !strings.Contains(line, "[INFO]") {
		t.Errorf("the promote that succeeded is logged as %q, want INFO", line)
	}
	if m := regexp.MustCompile(`.*operation not done: op=promote.*`).FindString(a.Log()); m != "" {
		t.Errorf("the agent log says the promote was not done: %s", m)
	}
}
