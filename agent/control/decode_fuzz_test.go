package control

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"testing"

	"github.com/deployd/deployd/agent/api"
)

// FuzzDecodeRequest: whatever a client sends, decoding a control request
// never panics, and either succeeds or answers 400/413 with a JSON error;
// a body strictDecode accepts is accepted, with the same value.
func FuzzDecodeRequest(f *testing.F) {
	for _, s := range []string{
		`{"apps":["web"],"strategy":"rolling"}`, `{"app":"web"}`, `{"app":"web","artifact":"/a.tar.gz","version":"1"}`,
		`{"app":"web","instances":"+1"}`, `{"binary":"/usr/bin/x","sha256":"00"}`, ``, `{`, `[]`, `null`,
		`{"apps":"web"}`, `{"unknown":1}`, `{"app":"web"}garbage`, `{"app":"web"} {}`, `{"app":"` + strings.Repeat("a", 1000) + `"}`,
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
			got := newTarget()
			ok := decode(rec, r, got)
			// A body that is exactly one JSON value of the request's type
			// (or empty), within the size limit, must be accepted and decode
			// to that value: refusing it, or accepting it but losing fields,
			// is a bug.
			if want := newTarget(); len(body) <= api.MaxRequestBytes && strictDecode(body, want) {
				if !ok {
					t.Fatalf("decode refused a valid %T %q: %d %s", want, body, rec.Code, rec.Body.String())
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("decode of %q = %+v, want %+v", body, got, want)
				}
			}
			if ok && !strictDecode(body, newTarget()) {
				t.Fatalf("decode accepted %q, which is not one JSON value of %T", body, got)
			}
			if ok {
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

// strictDecode is the reference: the body is empty (JSON whitespace) or exactly one
// JSON value with only v's fields, decoded into v.
func strictDecode(body []byte, v any) bool {
	if len(bytes.Trim(body, " \t\r\n")) == 0 { // JSON whitespace
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if dec.Decode(v) != nil {
		return false
	}
	var rest json.RawMessage
	return errors.Is(dec.Decode(&rest), io.EOF)
}
