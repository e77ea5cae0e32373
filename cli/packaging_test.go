package cli

import (
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/config"
	"github.com/deployd/deployd/internal/version"
)

var updatePackaging = flag.Bool("update-packaging", false, "rewrite packaging/deployd.service from `deployd startup systemd`")

// TestPackagedUnitIsStartupSystemd: the systemd unit the .deb and .rpm
// install (packaging/deployd.service, .goreleaser.yaml) is what `deployd
// startup systemd` writes for the packaged config and binary, so the package
// and the command never disagree. Rewrite it with
// `go test ./cli -run TestPackagedUnit -update-packaging`.
func TestPackagedUnitIsStartupSystemd(t *testing.T) {
	root := filepath.Join("..", "packaging")
	cfg, err := config.Load(filepath.Join(root, "deployd.toml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg.Path = "/etc/deployd/deployd.toml" // where the package puts it
	units, err := SystemdUnits(cfg, "/usr/bin/deployd", "deployd", false)
	if err != nil {
		t.Fatal(err)
	}
	// The header names the version that wrote the unit; a package's unit is
	// the same for every version.
	want := strings.Replace(units[0].Text, "(deployd "+version.String()+")", "(deployd, as packaged)", 1)
	path := filepath.Join(root, "deployd.service")
	if *updatePackaging {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("%s differs from `deployd startup systemd` (rerun with -update-packaging):\n%s\n--- want:\n%s", path, got, want)
	}
}
