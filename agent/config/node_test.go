package config

import (
	"strings"
	"testing"
)

func TestNodeKey(t *testing.T) {
	if got := loadOK(t, web).Apps["web"].Node; got != "auto" {
		t.Errorf("default node = %q, want auto", got)
	}
	for _, v := range []string{"auto", "on", "off"} {
		if got := loadOK(t, web+`node = "`+v+`"`).Apps["web"].Node; got != v {
			t.Errorf("node = %q read as %q", v, got)
		}
	}
	path := writeConfig(t, web+`node = "yes"`)
	_, err := Load(path)
	if err == nil || !strings.Contains(err.Error(), path+":3:") || !strings.Contains(err.Error(), `unknown node mode; use "auto"`) {
		t.Errorf("node = \"yes\": %v", err)
	}
	path = writeConfig(t, web+`node = true`)
	if _, err := Load(path); err == nil || !strings.Contains(err.Error(), `node = "off"`) {
		t.Errorf("node = true: %v", err)
	}
}
