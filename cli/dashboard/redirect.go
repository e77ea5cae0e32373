package dashboard

import (
	"encoding/json"
	"errors"
	"fmt"
	"html"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// RedirectPage writes an HTML page that sends a browser on to url (a
// meta refresh and a script, as Jupyter does) and returns its path, to be
// opened as a file:// URL: the URL with the token then goes on no command
// line (xdg-open's and the browser's are readable by every local user in
// /proc/PID/cmdline) and into no environment. The page is a 0600 file in a
// new 0700 folder of the user's runtime folder ($XDG_RUNTIME_DIR when it is
// the user's own and private) or of the temporary folder. remove deletes
// both; it is safe to call more than once.
func RedirectPage(url string) (path string, remove func(), err error) {
	dir, err := os.MkdirTemp(runtimeDir(), "deployd-dashboard-")
	if err != nil {
		return "", nil, fmt.Errorf("the page that opens the dashboard: %w", err)
	}
	var once sync.Once
	remove = func() { once.Do(func() { os.RemoveAll(dir) }) }
	path = filepath.Join(dir, "open.html")
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err == nil {
		_, err = f.Write(redirectHTML(url))
		err = errors.Join(err, f.Close())
	}
	if err != nil {
		remove()
		return "", nil, fmt.Errorf("the page that opens the dashboard: %w", err)
	}
	return path, remove, nil
}

// runtimeDir is $XDG_RUNTIME_DIR if it is a folder of this user that no
// one else may enter, else the temporary folder (the page's own folder is
// private either way).
func runtimeDir() string {
	dir := os.Getenv("XDG_RUNTIME_DIR")
	if !filepath.IsAbs(dir) {
		return os.TempDir()
	}
	fi, err := os.Stat(dir)
	if err != nil || !fi.IsDir() || fi.Mode().Perm()&0o077 != 0 {
		return os.TempDir()
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); !ok || int(st.Uid) != os.Getuid() {
		return os.TempDir()
	}
	return dir
}

func redirectHTML(url string) []byte {
	js, _ := json.Marshal(url) // a JavaScript string; json escapes <, > and &
	u := html.EscapeString(url)
	return fmt.Appendf(nil, `<!DOCTYPE html>
<html><head><meta charset="utf-8">
<meta name="referrer" content="no-referrer">
<meta http-equiv="refresh" content="1;url=%s">
<title>deployd dashboard</title></head>
<body><p>Opening <a href="%s">the deployd dashboard</a>…</p>
<script>window.location.replace(%s);</script></body></html>
`, u, u, js)
}
