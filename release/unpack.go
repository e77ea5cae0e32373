package release

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"fmt"
	"hash"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"syscall"
)

// PackEnd is the name of the last entry of a folder's tar stream (the
// client's api.PackDir writes it; a stream without it is incomplete).
const PackEnd = ".deployd-pack-end"

// Limits of an extracted tarball. A gzip'd tarball may also unpack to at
// most maxRatio times the compressed bytes read so far, beyond ratioFloor:
// text compresses about 10:1, binaries 3:1, while a file of zeros gives
// 1000:1 (14 MB of it would unpack to 14 GB).
const (
	maxEntries   = 100_000
	maxTotalSize = 8 << 30
	maxRatio     = 100
)

// ratioFloor is a variable for tests only.
var ratioFloor int64 = 256 << 20

// Extract unpacks a gzip'd tar stream into dst (an existing, empty folder).
// It refuses absolute names, names with "..", links (symbolic or hard) that
// resolve outside the release (following the links already extracted, as
// the kernel would), device files, FIFOs and sockets. Every write goes
// through an os.Root on dst, so nothing is ever written outside it.
func Extract(r io.Reader, dst string) error {
	in := &countReader{r: r}
	gz, err := gzip.NewReader(in)
	if err != nil {
		return fmt.Errorf("not a .tar.gz: %w", err)
	}
	defer gz.Close()
	return extract(tar.NewReader(gz), dst, nil, in)
}

// extract writes the entries of tr under dst (see Extract). With dig set,
// it also hashes each entry as digest hashes a folder. With compressed
// set (what the compressed stream read so far), the files written may
// total at most maxRatio times it (beyond ratioFloor).
func extract(tr *tar.Reader, dst string, dig hash.Hash, compressed *countReader) error {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	var total, written int64
	for n := 0; ; n++ {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) && dig != nil {
			// A folder's stream ends with PackEnd; without it the client
			// stopped early (it could not read something).
			return errors.New("the folder's tar stream ended before its end marker; the client did not send all of it")
		}
		if errors.Is(err, io.EOF) {
			return nil
		}
		if dig != nil && h.Name == PackEnd {
			if _, err := tr.Next(); !errors.Is(err, io.EOF) {
				return fmt.Errorf("the folder's tar stream goes on after its end marker %s", PackEnd)
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("read tarball: %w", err)
		}
		if n >= maxEntries {
			return fmt.Errorf("tarball has more than %d entries", maxEntries)
		}
		if h.Typeflag == tar.TypeReg {
			if total += h.Size; total > maxTotalSize {
				return fmt.Errorf("tarball unpacks to more than %d bytes", int64(maxTotalSize))
			}
		}
		var body io.Reader = tr
		if compressed != nil {
			body = &ratioReader{r: tr, written: &written, compressed: compressed}
		}
		if dig != nil {
			body = hashEntry(dig, h, tr)
		}
		if err := extractEntry(root, body, h); err != nil {
			return err
		}
	}
}

// ratioReader reads a file's body from a compressed tarball, refusing it
// once the files written total over maxRatio times the compressed bytes.
type ratioReader struct {
	r          io.Reader
	written    *int64 // by every file of the tarball
	compressed *countReader
}

func (r *ratioReader) Read(p []byte) (int, error) {
	n, err := r.r.Read(p)
	*r.written += int64(n)
	if w, c := *r.written, r.compressed.n; w > ratioFloor && w > maxRatio*c {
		return n, fmt.Errorf("tarball unpacks to over %d times its compressed size (%d bytes from %d): "+
			"refused as a likely decompression bomb (the limit is %d:1 beyond %d MiB)", maxRatio, w, c, maxRatio, ratioFloor>>20)
	}
	return n, err
}

// extractEntry writes one tar entry under root.
func extractEntry(root *os.Root, r io.Reader, h *tar.Header) error {
	name, err := safeName(h.Name)
	if err != nil || name == "." {
		return err
	}
	if name == metaFile {
		return fmt.Errorf("tarball entry %q: the name is reserved for deployd's record of the release", h.Name)
	}
	if err := checkParents(root, name); err != nil {
		return err
	}
	mode := fs.FileMode(h.Mode) & 0o777
	switch h.Typeflag {
	case tar.TypeDir:
		return root.MkdirAll(name, 0o755|mode)
	case tar.TypeReg:
		return writeEntry(root, r, name, mode)
	case tar.TypeSymlink:
		if err := checkLink(root, name, h.Linkname); err != nil {
			return err
		}
		if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
			return err
		}
		return root.Symlink(h.Linkname, name)
	case tar.TypeLink:
		ln, err := safeName(h.Linkname)
		if err != nil || ln == "." {
			return fmt.Errorf("tarball entry %q: hard link to %q outside the release", h.Name, h.Linkname)
		}
		if err := checkParents(root, ln); err != nil {
			return err
		}
		// A hard link to a symlink would move a relative target.
		if fi, err := root.Lstat(ln); err != nil || !fi.Mode().IsRegular() {
			return fmt.Errorf("tarball entry %q: hard link to %q, which is not a regular file of the release", h.Name, h.Linkname)
		}
		if err := root.Link(ln, name); err != nil {
			return fmt.Errorf("tarball entry %q: %w", h.Name, err)
		}
		return nil
	case tar.TypeXGlobalHeader, tar.TypeXHeader:
		return nil
	}
	return fmt.Errorf("tarball entry %q is a device, FIFO or other special file (type %q); releases hold only files, folders and links",
		h.Name, string(h.Typeflag))
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

// maxLinkDepth bounds link-following in checkLink, as the kernel's ELOOP.
const maxLinkDepth = 40

// checkLink refuses a symlink at name whose target resolves outside the
// release, following the links already in root the way the kernel would.
// A ".." after a component that does not exist yet is refused too: a link
// created there later could move it.
func checkLink(root *os.Root, name, target string) error {
	outside := fmt.Errorf("tarball entry %q: link to %q points outside the release", name, target)
	if target == "" || path.IsAbs(target) {
		return outside
	}
	var stack []string
	if d := path.Dir(name); d != "." {
		stack = strings.Split(d, "/")
	}
	if !resolveInside(root, stack, target, 0) {
		return outside
	}
	return nil
}

// resolveInside walks target from the folder stack (components below the
// root) and reports whether it stays inside.
func resolveInside(root *os.Root, stack []string, target string, depth int) bool {
	if depth > maxLinkDepth || path.IsAbs(target) {
		return false
	}
	missing := false
	for _, p := range strings.Split(target, "/") {
		switch p {
		case "", ".":
			continue
		case "..":
			if len(stack) == 0 || missing {
				return false
			}
			stack = stack[:len(stack)-1]
			continue
		}
		stack = append(stack, p)
		if missing {
			continue
		}
		cur := strings.Join(stack, "/")
		fi, err := root.Lstat(cur)
		if err != nil {
			missing = true
			continue
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			link, err := root.Readlink(cur)
			if err != nil || !resolveInside(root, stack[:len(stack)-1], link, depth+1) {
				return false
			}
			// Where the link leads is inside; go on from there textually
			// (its own links were checked when it was made).
			stack = resolvedStack(stack[:len(stack)-1], link)
		}
	}
	return true
}

func resolvedStack(stack []string, link string) []string {
	out := append([]string(nil), stack...)
	for _, p := range strings.Split(link, "/") {
		switch p {
		case "", ".":
		case "..":
			if len(out) > 0 {
				out = out[:len(out)-1]
			}
		default:
			out = append(out, p)
		}
	}
	return out
}

// checkParents refuses an entry whose parent folders include a symlink, so
// that a link entry cannot redirect later entries.
func checkParents(root *os.Root, name string) error {
	dir := path.Dir(name)
	cur := ""
	for _, part := range strings.Split(dir, "/") {
		if part == "." || part == "" {
			continue
		}
		cur = path.Join(cur, part)
		fi, err := root.Lstat(cur)
		if errors.Is(err, fs.ErrNotExist) {
			return nil
		}
		if err != nil {
			return err
		}
		if fi.Mode()&fs.ModeSymlink != 0 {
			return fmt.Errorf("tarball entry %q goes through the link %q; releases may not write through links", name, cur)
		}
	}
	return nil
}

// writeEntry writes a regular file at name under root; never through a link.
func writeEntry(root *os.Root, r io.Reader, name string, mode fs.FileMode) error {
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	if fi, err := root.Lstat(name); err == nil && !fi.Mode().IsRegular() {
		return fmt.Errorf("tarball entry %s would replace a link or folder", name)
	}
	f, err := root.OpenFile(name, os.O_CREATE|os.O_TRUNC|os.O_WRONLY|syscall.O_NOFOLLOW, mode|0o400)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, r); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

func copyFile(root *os.Root, src, name string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	return writeEntry(root, in, name, fi.Mode().Perm())
}

// copyTree copies a folder: files, folders and links that stay inside it.
func copyTree(src string, root *os.Root) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(src, p)
		if rel == "." {
			return nil
		}
		name := filepath.ToSlash(rel)
		if name == metaFile {
			return fmt.Errorf("%s: the name %s is reserved for deployd's record of the release", p, metaFile)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		switch {
		case info.IsDir():
			return root.MkdirAll(name, info.Mode().Perm()|0o700)
		case info.Mode()&fs.ModeSymlink != 0:
			link, err := os.Readlink(p)
			if err != nil {
				return err
			}
			if err := checkLink(root, name, link); err != nil {
				return err
			}
			return root.Symlink(link, name)
		case info.Mode().IsRegular():
			return copyFile(root, p, name)
		}
		return fmt.Errorf("%s is a device, FIFO or socket; releases hold only files, folders and links", p)
	})
}
