package nodejs

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"syscall"
)

// Preload is the preload file on disk. Safe for concurrent use: Verify
// only reads, and a repair is an atomic rename.
type Preload struct {
	// Path is the file node loads: <state_dir>/node/preload-<sha256[:16]>.cjs.
	Path string
	data []byte // what the file holds; nil: the Node.js preload
}

func (p *Preload) bytes() []byte {
	if p.data != nil {
		return p.data
	}
	return preload
}

// Install writes the embedded preload under stateDir (folder 0755, file
// 0644, both the agent's own: readable by workers of any user, writable by
// the agent alone) unless an identical file is there, and verifies it.
func Install(stateDir string) (*Preload, error) {
	return InstallFile(filepath.Join(stateDir, "node"), "preload-"+Sum()[:16]+".cjs", preload)
}

// InstallFile is Install for another runtime's preload: data written as
// dir/name with the same modes and checks (workers/jsdrain: Bun and Deno).
func InstallFile(dir, name string, data []byte) (*Preload, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, errorf("%w", err)
	}
	p := &Preload{Path: filepath.Join(dir, name), data: data}
	if err := p.Verify(); err != nil {
		if err := p.write(); err != nil {
			return nil, err
		}
		if err := p.Verify(); err != nil {
			return nil, err
		}
	}
	return p, nil
}

// Verify checks that the folder and the file belong to the agent's user, are
// writable by nobody else, and that the file holds the embedded bytes
// exactly. Called before each start of a node worker.
func (p *Preload) Verify() error {
	dir := filepath.Dir(p.Path)
	if err := ownedNotShared(dir, true); err != nil {
		return err
	}
	f, err := os.OpenFile(p.Path, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return errorf("%w", err)
	}
	defer f.Close()
	if err := ownedNotShared(p.Path, false); err != nil {
		return err
	}
	got, err := io.ReadAll(io.LimitReader(f, int64(len(p.bytes()))+1))
	if err != nil {
		return errorf("read %s: %w", p.Path, err)
	}
	if !bytes.Equal(got, p.bytes()) {
		return errorf("%s differs from the preload built into deployd", p.Path)
	}
	return nil
}

// Repair rewrites the file when Verify fails (someone changed it) and
// verifies again.
func (p *Preload) Repair() error {
	if p.Verify() == nil {
		return nil
	}
	if err := p.write(); err != nil {
		return err
	}
	return p.Verify()
}

func ownedNotShared(path string, isDir bool) error {
	fi, err := os.Lstat(path)
	if err != nil {
		return errorf("%w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case isDir && !fi.IsDir(), !isDir && !fi.Mode().IsRegular():
		return errorf("%s is not a plain %s", path, map[bool]string{true: "folder", false: "file"}[isDir])
	case !ok || int(st.Uid) != os.Geteuid():
		return errorf("%s does not belong to the agent's user (uid %d): remove it, the agent writes it again", path, os.Geteuid())
	case fi.Mode().Perm()&0o022 != 0:
		return errorf("%s is writable by other users (mode %s): remove it, the agent writes it again", path, fi.Mode().Perm())
	}
	return nil
}

// write replaces the file atomically: a temp file in the same folder, then rename.
func (p *Preload) write() error {
	dir := filepath.Dir(p.Path)
	if err := ownedNotShared(dir, true); err != nil {
		return err
	}
	f, err := os.CreateTemp(dir, ".preload-*")
	if err != nil {
		return errorf("%w", err)
	}
	tmp := f.Name()
	_, err = f.Write(p.bytes())
	if err == nil {
		err = f.Chmod(0o644)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p.Path)
	}
	if err != nil {
		os.Remove(tmp)
		return errorf("write %s: %w", p.Path, err)
	}
	return nil
}
