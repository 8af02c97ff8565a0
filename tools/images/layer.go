package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"
)

// A file is one entry of a layer: a regular file, a directory or a symbolic
// link, at an absolute path in the image. Owner is always root (0:0): every
// image's files are root's, read-only to the user the image runs as.
type file struct {
	Path string // absolute, e.g. /etc/passwd
	Type byte   // tar.TypeReg, tar.TypeDir or tar.TypeSymlink
	Mode int64  // permission bits, sticky included (0o1777)
	Link string // the target of a symbolic link
	Data []byte
}

func regular(p string, mode int64, data []byte) file {
	return file{Path: p, Type: tar.TypeReg, Mode: mode, Data: data}
}

func dir(p string, mode int64) file { return file{Path: p, Type: tar.TypeDir, Mode: mode} }

func symlink(p, target string) file {
	return file{Path: p, Type: tar.TypeSymlink, Mode: 0o777, Link: target}
}

// layerTar writes files as a tar stream that depends on nothing but its
// inputs: every parent directory is listed (0755 unless given), entries
// are sorted by path, every mtime is mtime, owners are 0:0 with no names.
func layerTar(files []file, mtime time.Time) ([]byte, error) {
	byPath := map[string]file{}
	for _, f := range files {
		p := path.Clean(f.Path)
		if !path.IsAbs(p) || p == "/" {
			return nil, fmt.Errorf("layer entry %q: not an absolute path below /", f.Path)
		}
		if _, dup := byPath[p]; dup {
			return nil, fmt.Errorf("layer entry %s: listed twice", p)
		}
		f.Path = p
		byPath[p] = f
	}
	for p := range byPath {
		for d := path.Dir(p); d != "/"; d = path.Dir(d) {
			if _, ok := byPath[d]; !ok {
				byPath[d] = dir(d, 0o755)
			}
		}
	}
	paths := make([]string, 0, len(byPath))
	for p := range byPath {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	entries := make([]tarEntry, 0, len(paths))
	for _, p := range paths {
		f := byPath[p]
		name := strings.TrimPrefix(p, "/")
		if f.Type == tar.TypeDir {
			name += "/"
		}
		entries = append(entries, tarEntry{name: name, file: f})
	}
	return writeTar(entries, mtime)
}

type tarEntry struct {
	name string
	file file
}

// writeTar writes entries in the order given, with fixed times and owners.
func writeTar(entries []tarEntry, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{
			Name:     e.name,
			Typeflag: e.file.Type,
			Mode:     e.file.Mode,
			Linkname: e.file.Link,
			ModTime:  mtime,
			Format:   tar.FormatPAX,
		}
		if e.file.Type == tar.TypeReg {
			hdr.Size = int64(len(e.file.Data))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, fmt.Errorf("write tar header %s: %w", e.name, err)
		}
		if _, err := tw.Write(e.file.Data); err != nil {
			return nil, fmt.Errorf("write tar entry %s: %w", e.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("close tar: %w", err)
	}
	return buf.Bytes(), nil
}

// gzipBytes compresses b with an empty gzip header (no name, no mtime), so
// the same input always gives the same bytes.
func gzipBytes(b []byte) ([]byte, error) {
	var buf bytes.Buffer
	zw, err := gzip.NewWriterLevel(&buf, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(b); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	if err := zw.Close(); err != nil {
		return nil, fmt.Errorf("gzip: %w", err)
	}
	return buf.Bytes(), nil
}
