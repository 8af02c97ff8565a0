package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"sort"
	"strings"
)

// A lockedDeb is one line of debian-packages.lock: a Debian package pinned
// by version and by the sha256 of its .deb.
type lockedDeb struct {
	Package, Version, Arch, SHA256 string
}

func (d lockedDeb) String() string { return d.Package + " " + d.Version + " " + d.Arch }

// fileName is where the .deb is kept in the cache (':' of an epoch would
// need quoting).
func (d lockedDeb) fileName() string {
	return strings.ReplaceAll(d.Package+"_"+d.Version+"_"+d.Arch+".deb", ":", "%3a")
}

const lockHeader = `# Debian packages in the images (make images), pinned by version and by the
# sha256 of the .deb; fetched with apt-get download from this machine's apt
# sources (Debian 12, bookworm). When the mirror has moved on (a security
# update), refresh it: make images IMAGES_FLAGS=--update-lock
# package version arch sha256
`

func parseLock(r io.Reader) ([]lockedDeb, error) {
	var debs []lockedDeb
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 4 {
			return nil, fmt.Errorf("line %d: want `package version arch sha256`, got %q", n, line)
		}
		if _, err := hex.DecodeString(f[3]); err != nil || len(f[3]) != 64 {
			return nil, fmt.Errorf("line %d: %q is not a sha256", n, f[3])
		}
		debs = append(debs, lockedDeb{Package: f[0], Version: f[1], Arch: f[2], SHA256: f[3]})
	}
	return debs, sc.Err()
}

func formatLock(debs []lockedDeb) []byte {
	var b bytes.Buffer
	b.WriteString(lockHeader)
	for _, d := range debs {
		fmt.Fprintf(&b, "%s %s %s %s\n", d.Package, d.Version, d.Arch, d.SHA256)
	}
	return b.Bytes()
}

func lockFor(debs []lockedDeb, pkg, arch string) (lockedDeb, error) {
	for _, d := range debs {
		if d.Package == pkg && d.Arch == arch {
			return d, nil
		}
	}
	return lockedDeb{}, fmt.Errorf("the lock has no %s for %s: run `make images IMAGES_FLAGS=--update-lock`", pkg, arch)
}

func sha256File(p string) (string, error) {
	b, err := os.ReadFile(p)
	if err != nil {
		return "", err
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

// fetchDeb returns the path of d's .deb in cacheDir, downloading it with
// apt-get when it is not there, and checks it against the lock's sha256.
func fetchDeb(d lockedDeb, cacheDir string) (string, error) {
	dst := filepath.Join(cacheDir, d.fileName())
	if sum, err := sha256File(dst); err == nil && sum == d.SHA256 {
		return dst, nil
	}
	tmp, err := aptDownload(d.Package+":"+d.Arch+"="+d.Version, cacheDir)
	if err != nil {
		return "", fmt.Errorf("%s is not available from the apt sources (%w); the mirror keeps only the "+
			"current version of a package: `apt-get update`, then `make images IMAGES_FLAGS=--update-lock` "+
			"to lock the candidate `apt-cache policy %s` shows, and commit tools/images/debian-packages.lock", d, err, d.Package)
	}
	defer removeAll(filepath.Dir(tmp))
	sum, err := sha256File(tmp)
	if err != nil {
		return "", err
	}
	if sum != d.SHA256 {
		return "", fmt.Errorf("%s: the .deb apt-get downloaded has sha256 %s, the lock says %s", d, sum, d.SHA256)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", fmt.Errorf("cache %s: %w", d, err)
	}
	return dst, nil
}

// aptDownload runs `apt-get download spec` in a new directory under
// cacheDir and returns the .deb it wrote.
func aptDownload(spec, cacheDir string) (string, error) {
	if err := os.MkdirAll(cacheDir, 0o755); err != nil {
		return "", err
	}
	tmp, err := os.MkdirTemp(cacheDir, "download-")
	if err != nil {
		return "", err
	}
	cmd := exec.Command("apt-get", "download", "-q", spec)
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		removeAll(tmp)
		return "", fmt.Errorf("apt-get download %s: %w: %s", spec, err, strings.TrimSpace(string(out)))
	}
	debs, err := filepath.Glob(filepath.Join(tmp, "*.deb"))
	if err != nil || len(debs) != 1 {
		removeAll(tmp)
		return "", fmt.Errorf("apt-get download %s: want one .deb, found %d", spec, len(debs))
	}
	return debs[0], nil
}

// updateLock locks the candidate version of each package the lock names
// (libc6 for arch when there is no lock yet) and caches the .deb.
func updateLock(lockPath, cacheDir, arch string) ([]lockedDeb, error) {
	old := []lockedDeb{{Package: "libc6", Arch: arch}}
	if b, err := os.ReadFile(lockPath); err == nil {
		if old, err = parseLock(bytes.NewReader(b)); err != nil {
			return nil, fmt.Errorf("%s: %w", lockPath, err)
		}
	}
	var debs []lockedDeb
	for _, o := range old {
		tmp, err := aptDownload(o.Package+":"+o.Arch, cacheDir)
		if err != nil {
			return nil, err
		}
		out, err := exec.Command("dpkg-deb", "--field", tmp, "Version").Output()
		if err != nil {
			return nil, fmt.Errorf("dpkg-deb --field %s: %w", tmp, err)
		}
		sum, err := sha256File(tmp)
		if err != nil {
			return nil, err
		}
		d := lockedDeb{Package: o.Package, Version: strings.TrimSpace(string(out)), Arch: o.Arch, SHA256: sum}
		err = os.Rename(tmp, filepath.Join(cacheDir, d.fileName()))
		removeAll(filepath.Dir(tmp))
		if err != nil {
			return nil, err
		}
		debs = append(debs, d)
	}
	return debs, os.WriteFile(lockPath, formatLock(debs), 0o644)
}

// debContents is what a .deb installs, by path without the leading "/",
// and its control file.
type debContents struct {
	Files   map[string]file
	Control []byte
}

func readDeb(debPath string) (*debContents, error) {
	control, err := exec.Command("dpkg-deb", "--info", debPath, "control").Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-deb --info %s control: %w", debPath, err)
	}
	fsys, err := exec.Command("dpkg-deb", "--fsys-tarfile", debPath).Output()
	if err != nil {
		return nil, fmt.Errorf("dpkg-deb --fsys-tarfile %s: %w", debPath, err)
	}
	c := &debContents{Files: map[string]file{}, Control: control}
	tr := tar.NewReader(bytes.NewReader(fsys))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read %s: %w", debPath, err)
		}
		p := path.Clean("/" + hdr.Name)
		f := file{Path: p, Type: hdr.Typeflag, Mode: hdr.Mode & 0o7777, Link: hdr.Linkname}
		switch hdr.Typeflag {
		case tar.TypeReg:
			if f.Data, err = io.ReadAll(tr); err != nil {
				return nil, fmt.Errorf("read %s %s: %w", debPath, p, err)
			}
		case tar.TypeDir, tar.TypeSymlink:
		default:
			continue // hard links and the like: nothing a binary loads
		}
		c.Files[p] = f
	}
	return c, nil
}

// resolve returns the files that make up p: p itself and, for a symbolic
// link, what it points to, followed to a regular file.
func (c *debContents) resolve(p string) ([]file, error) {
	var out []file
	for range 8 {
		f, ok := c.Files[p]
		if !ok {
			return nil, fmt.Errorf("%s is not in the package", p)
		}
		out = append(out, f)
		if f.Type != tar.TypeSymlink {
			return out, nil
		}
		if path.IsAbs(f.Link) {
			p = f.Link
		} else {
			p = path.Join(path.Dir(p), f.Link)
		}
	}
	return nil, fmt.Errorf("%s: too many symbolic links", p)
}

// libDirs are where the dynamic loader looks for a library's soname
// (Debian's multiarch system search path, as `ld.so --help` lists it).
func libDirs(triplet string) []string {
	return []string{"/lib/" + triplet, "/usr/lib/" + triplet, "/lib", "/usr/lib"}
}

// runtimeFiles returns the files of the package that binary needs at run
// time: its program interpreter and the closure of its DT_NEEDED libraries,
// plus extra sonames (libraries it dlopens, and theirs), each with the
// symbolic links that lead to it. Each symbol version the binary needs of a
// library (GLIBC_2.34, …) must be one the package's library defines: a
// binary linked against a newer glibc than the lock's fails here, not at
// run time.
func (c *debContents) runtimeFiles(binary []byte, triplet string, extra []string) ([]file, error) {
	ef, err := elf.NewFile(bytes.NewReader(binary))
	if err != nil {
		return nil, fmt.Errorf("read ELF: %w", err)
	}
	defer closeELF(ef)
	want := map[string]file{}
	add := func(fs []file) {
		for _, f := range fs {
			want[f.Path] = f
		}
	}
	if interp := progInterp(ef); interp != "" {
		fs, err := c.resolve(interp)
		if err != nil {
			return nil, fmt.Errorf("program interpreter: %w", err)
		}
		add(fs)
	}
	needed, err := ef.ImportedLibraries()
	if err != nil {
		return nil, fmt.Errorf("read DT_NEEDED: %w", err)
	}
	queue := append(needed, extra...)
	libs := map[string][]byte{} // soname: the library's bytes
	seen := map[string]bool{}
	for len(queue) > 0 {
		soname := queue[0]
		queue = queue[1:]
		if seen[soname] {
			continue
		}
		seen[soname] = true
		var fs []file
		for _, d := range libDirs(triplet) {
			if fs, err = c.resolve(path.Join(d, soname)); err == nil {
				break
			}
		}
		if fs == nil {
			return nil, fmt.Errorf("library %s is not in the package", soname)
		}
		add(fs)
		libs[soname] = fs[len(fs)-1].Data
		lib, err := elf.NewFile(bytes.NewReader(libs[soname]))
		if err != nil {
			return nil, fmt.Errorf("read ELF %s: %w", soname, err)
		}
		libNeeded, err := lib.ImportedLibraries()
		closeELF(lib)
		if err != nil {
			return nil, fmt.Errorf("read DT_NEEDED of %s: %w", soname, err)
		}
		queue = append(queue, libNeeded...)
	}
	if err := checkVersions(ef, libs); err != nil {
		return nil, err
	}
	out := make([]file, 0, len(want))
	for _, f := range want {
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Path < out[j].Path })
	return out, nil
}

// checkVersions checks that the libraries define every symbol version the
// binary needs of them.
func checkVersions(bin *elf.File, libs map[string][]byte) error {
	needs, err := bin.DynamicVersionNeeds()
	if err != nil {
		return fmt.Errorf("read the symbol versions the binary needs: %w", err)
	}
	var errs []error
	for _, n := range needs {
		lib, err := elf.NewFile(bytes.NewReader(libs[n.Name]))
		if err != nil {
			return fmt.Errorf("read ELF %s: %w", n.Name, err)
		}
		defs, err := lib.DynamicVersions()
		closeELF(lib)
		if err != nil {
			return fmt.Errorf("read the symbol versions of %s: %w", n.Name, err)
		}
		have := map[string]bool{}
		for _, d := range defs {
			have[d.Name] = true
		}
		for _, d := range n.Needs {
			if !have[d.Dep] {
				errs = append(errs, fmt.Errorf("the binary needs %s of %s, which the package's does not define "+
					"(was it linked against a newer glibc than the lock's? build on Debian 12)", d.Dep, n.Name))
			}
		}
	}
	return errors.Join(errs...)
}

// removeAll removes a temporary directory; one left behind is harmless.
func removeAll(p string) { _ = os.RemoveAll(p) }

// closeELF closes an ELF file read from memory, which cannot fail.
func closeELF(f *elf.File) { _ = f.Close() }

// progInterp is the binary's PT_INTERP ("" for a static binary).
func progInterp(ef *elf.File) string {
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(p.Open())
			if err != nil {
				return ""
			}
			return strings.TrimRight(string(b), "\x00")
		}
	}
	return ""
}
