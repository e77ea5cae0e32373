package api

import (
	"archive/tar"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Artifact kinds of DeployRequest.Kind.
const (
	ArtifactFile    = "file"   // one executable (a regular file)
	ArtifactTarball = "tar.gz" // a gzip'd tar (a regular file)
	ArtifactDir     = "dir"    // a folder, sent as PackDir's tar stream
)

// ArtifactKind is the kind of the artifact at path, given what it is.
func ArtifactKind(path string, fi fs.FileInfo) string {
	switch {
	case fi.IsDir():
		return ArtifactDir
	case strings.HasSuffix(path, ".tar.gz") || strings.HasSuffix(path, ".tgz"):
		return ArtifactTarball
	}
	return ArtifactFile
}

// CheckReadable walks the folder dir and returns the first entry the
// caller cannot read, so that a deploy is refused before anything is sent.
func CheckReadable(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			f.Close()
		}
		return nil
	})
}

// PackDir writes the folder dir to w as an uncompressed tar stream: every
// entry in filepath.WalkDir order, the folder itself first as ".", with its
// mode, link targets and contents (what the agent hashes for --sha256 of a
// folder), then PackEnd. Files are read with the caller's permissions. Devices, FIFOs and
// sockets are refused.
func PackDir(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == PackEnd {
			return fmt.Errorf("%s: the name %s is reserved for deployd's folder stream; rename it", p, PackEnd)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case !info.IsDir() && !info.Mode().IsRegular():
			return fmt.Errorf("%s is a device, FIFO or socket; releases hold only files, folders and links", p)
		}
		h, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		h.Name = filepath.ToSlash(rel)
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: PackEnd, Typeflag: tar.TypeReg, Mode: 0o600}); err != nil {
		return err
	}
	return tw.Close()
}

// PackEnd is the last entry of PackDir's stream: the agent installs a
// folder only when it came (release.PackEnd is the same name).
const PackEnd = ".deployd-pack-end"
