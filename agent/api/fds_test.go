package api

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

type connKey struct{}

// A file passed with a request reaches the handler as the same open file,
// and a request without one gets ErrNoFile; descriptors nobody takes are
// closed with the connection.
func TestFilePassedWithRequest(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "s.sock")
	l, err := net.ListenUnix("unix", &net.UnixAddr{Name: sock, Net: "unix"})
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{
		ConnContext: func(ctx context.Context, c net.Conn) context.Context { return context.WithValue(ctx, connKey{}, c) },
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			f, err := r.Context().Value(connKey{}).(*FileConn).TakeFile()
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			defer f.Close()
			io.Copy(w, f)
		}),
	}
	go srv.Serve(FileListener{l})
	defer srv.Close()

	src := filepath.Join(t.TempDir(), "artifact")
	os.WriteFile(src, []byte("the caller's bytes"), 0o600)
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	c := NewClient(sock)
	resp, err := c.doOn(t.Context(), c.withFile(f), http.MethodPost, "/", struct{}{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(b) != "the caller's bytes" {
		t.Errorf("handler read %q", b)
	}
	if _, err := f.Stat(); err == nil {
		t.Error("the client kept its copy of the sent file open")
	}
	_, err = c.do(t.Context(), http.MethodPost, "/", struct{}{})
	if err == nil || !strings.Contains(err.Error(), "no file descriptor") {
		t.Errorf("request without a file: %v", err)
	}
}
