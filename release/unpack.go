package release

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
)

// Limits of an extracted tarball.
const (
	maxEntries   = 100_000
	maxTotalSize = 8 << 30
)

// Extract unpacks a gzip'd tar stream into dst (an existing, empty folder).
// It refuses, before writing anything outside dst: absolute names, names
// with "..", links (symbolic or hard) that point outside the release,
// device files, FIFOs and sockets. Nothing is ever written outside dst.
func Extract(r io.Reader, dst string) error {
	gz, err := gzip.NewReader(r)
	if err != nil {
		return fmt.Errorf("not a .tar.gz: %w", err)
	}
	defer gz.Close()
	tr := tar.NewReader(gz)
	var total int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tarball: %w", err)
		}
		if n >= maxEntries {
			return fmt.Errorf("tarball has more than %d entries", maxEntries)
		}
		name, err := safeName(h.Name)
		if err != nil {
			return err
		}
		if name == "." {
			continue
		}
		target := filepath.Join(dst, filepath.FromSlash(name))
		if err := checkParents(dst, name); err != nil {
			return err
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(target, 0o755|fs.FileMode(h.Mode)&0o777); err != nil {
				return err
			}
		case tar.TypeReg:
			total += h.Size
			if total > maxTotalSize {
				return fmt.Errorf("tarball unpacks to more than %d bytes", int64(maxTotalSize))
			}
			if err := writeEntry(tr, target, fs.FileMode(h.Mode)&0o777); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := checkLink(name, h.Linkname); err != nil {
				return err
			}
			if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
				return err
			}
			if err := os.Symlink(h.Linkname, target); err != nil {
				return err
			}
		case tar.TypeLink:
			ln, err := safeName(h.Linkname)
			if err != nil || ln == "." {
				return fmt.Errorf("tarball entry %q: hard link to %q outside the release", h.Name, h.Linkname)
			}
			if err := checkParents(dst, ln); err != nil {
				return err
			}
			// A hard link to a symlink would move a relative target.
			if fi, err := os.Lstat(filepath.Join(dst, filepath.FromSlash(ln))); err != nil || !fi.Mode().IsRegular() {
				return fmt.Errorf("tarball entry %q: hard link to %q, which is not a regular file of the release", h.Name, h.Linkname)
			}
			if err := os.Link(filepath.Join(dst, filepath.FromSlash(ln)), target); err != nil {
				return fmt.Errorf("tarball entry %q: %w", h.Name, err)
			}
		case tar.TypeXGlobalHeader, tar.TypeXHeader:
			continue
		default:
			return fmt.Errorf("tarball entry %q is a device, FIFO or other special file (type %q); releases hold only files, folders and links",
				h.Name, string(h.Typeflag))
		}
	}
}

// safeName cleans a tar entry name; absolute names and ".." are refused.
func safeName(name string) (string, error) {
	if name == "" {
		return "", errors.New("tarball entry with an empty name")
	}
	if strings.HasPrefix(name, "/") || filepath.IsAbs(name) {
		return "", fmt.Errorf("tarball entry %q is an absolute path; entries must be relative", name)
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", fmt.Errorf("tarball entry %q contains \"..\"; entries must stay inside the release", name)
		}
	}
	if strings.ContainsRune(name, 0) || strings.Contains(name, "\\") {
		return "", fmt.Errorf("tarball entry %q has an invalid character", name)
	}
	return path.Clean(name), nil
}

// checkLink refuses a symlink at name whose target leaves the release.
func checkLink(name, target string) error {
	if target == "" || path.IsAbs(target) {
		return fmt.Errorf("tarball entry %q: link to %q points outside the release", name, target)
	}
	resolved := path.Join(path.Dir(name), target)
	if resolved == ".." || strings.HasPrefix(resolved, "../") {
		return fmt.Errorf("tarball entry %q: link to %q points outside the release", name, target)
	}
	return nil
}

// checkParents refuses an entry whose parent folders include a symlink, so
// that a link entry cannot redirect later entries outside dst.
func checkParents(dst, name string) error {
	dir := path.Dir(name)
	cur := dst
	for _, part := range strings.Split(dir, "/") {
		if part == "." || part == "" {
			continue
		}
		cur = filepath.Join(cur, part)
		fi, err := os.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("tarball entry %q goes through the link %q; releases may not write through links", name, part)
		}
	}
	return nil
}

func writeEntry(r io.Reader, target string, mode fs.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return err
	}
	if fi, err := os.Lstat(target); err == nil && fi.Mode()&fs.ModeSymlink != 0 {
		return fmt.Errorf("tarball entry %s would write through a link", target)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode|0o400)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	return writeEntry(in, dst, fi.Mode().Perm())
}

// copyTree copies a folder: files, folders and links that stay inside it.
func copyTree(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "." {
			return nil
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			return os.MkdirAll(target, info.Mode().Perm()|0o700)
		case info.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := checkLink(filepath.ToSlash(rel), link); err != nil {
				return err
			}
			return os.Symlink(link, target)
		case info.Mode().IsRegular():
			return copyFile(p, target)
		}
		return fmt.Errorf("%s is a device, FIFO or socket; releases hold only files, folders and links", p)
	})
}
