package agent

import (
	"bytes"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/api"
)

// FuzzDecodeRequest: whatever a client sends, decoding a control request
// never panics, and either succeeds or answers 400/413 with a JSON error.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"apps":["web"],"strategy":"rolling"}`, `{"app":"web"}`, `{"app":"web","artifact":"/a.tar.gz","version":"1"}`,
		`{"app":"web","instances":"+1"}`, `{"binary":"/usr/bin/x","sha256":"00"}`, ``, `{`, `[]`, `null`,
		`{"apps":"web"}`, `{"unknown":1}`, `{"app":"` + strings.Repeat("a", 1000) + `"}`,
	} {
		f.Add([]byte(s))
	}
	targets := []func() any{
		func() any { return &api.ReloadRequest{} }, func() any { return &api.AppRequest{} },
		func() any { return &api.DeployRequest{} }, func() any { return &api.RollbackRequest{} },
		func() any { return &api.ScaleRequest{} }, func() any { return &api.UpgradeRequest{} },
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, newTarget := range targets {
			rec := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodPost, "/v1/x", bytes.NewReader(body))
			r.Body = http.MaxBytesReader(rec, r.Body, api.MaxRequestBytes)
			if decode(rec, r, newTarget()) {
				if rec.Code != http.StatusOK || rec.Body.Len() != 0 {
					t.Fatalf("decode succeeded but answered %d %q", rec.Code, rec.Body.String())
				}
				continue
			}
			if rec.Code != http.StatusBadRequest && rec.Code != http.StatusRequestEntityTooLarge {
				t.Fatalf("decode failed with %d", rec.Code)
			}
			if !strings.HasPrefix(rec.Body.String(), `{"error":`) {
				t.Fatalf("error answer is not a JSON error: %q", rec.Body.String())
			}
		}
	})
}

func TestParseScale(t *testing.T) {
	for _, tc := range []struct {
		in   string
		cur  int
		want int
		ok   bool
	}{
		{"4", 2, 4, true}, {"+1", 2, 3, true}, {"-1", 2, 1, true}, {"-2", 2, 0, false},
		{"0", 2, 0, false}, {"x", 2, 0, false}, {"2000", 1, 0, false}, {" 3 ", 1, 3, true},
	} {
		got, err := parseScale(tc.in, tc.cur)
		if (err == nil) != tc.ok || (tc.ok && got != tc.want) {
			t.Errorf("parseScale(%q, %d) = %d, %v; want %d ok=%v", tc.in, tc.cur, got, err, tc.want, tc.ok)
		}
	}
}
