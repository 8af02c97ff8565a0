// Command images builds pulse's container images without a Docker engine
// (make images): pulse-agent, pulse-aggregator, pulse-relay, vllm-sim and pause, each an
// OCI image layout in a tarball, bin/images/<name>.tar, the same digest for
// the same source. The agent gets glibc and the loader from Debian's libc6,
// pinned in debian-packages.lock. Run it from anywhere in the repository;
// `go run . -h` lists the flags.
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

type options struct {
	repo, out, version, registry, source, only, cacheDir string
	updateLock                                           bool
}

func newOptions() *options {
	cache, err := os.UserCacheDir()
	if err != nil {
		cache = os.TempDir()
	}
	cache = filepath.Join(cache, "pulse-images")
	if c := os.Getenv("PULSE_IMAGES_CACHE"); c != "" {
		cache = c
	}
	return &options{out: "bin/images", version: "dev", registry: "ghcr.io/pulse-io",
		source: "https://github.com/pulse-io/pulse", cacheDir: cache}
}

func (o *options) addFlags(fs *flag.FlagSet) {
	fs.StringVar(&o.repo, "repo", o.repo, "repository root (default: git rev-parse --show-toplevel)")
	fs.StringVar(&o.out, "out", o.out, "directory of the image tarballs, relative to --repo")
	fs.StringVar(&o.version, "version", o.version, "version: the image tag, pkg/version.Version, org.opencontainers.image.version")
	fs.StringVar(&o.registry, "registry", o.registry, "registry and repository prefix of the image references")
	fs.StringVar(&o.source, "source", o.source, "org.opencontainers.image.source")
	fs.StringVar(&o.only, "only", o.only, "comma-separated images to build (default: all)")
	fs.StringVar(&o.cacheDir, "cache", o.cacheDir, "where downloaded .debs are kept ($PULSE_IMAGES_CACHE)")
	fs.BoolVar(&o.updateLock, "update-lock", o.updateLock, "lock the candidate version of each Debian package in debian-packages.lock, then build")
}

func (o *options) validate() error {
	var errs []error
	for n := range strings.SplitSeq(o.only, ",") {
		if n != "" && !slices.ContainsFunc(targets, func(t target) bool { return t.Name == n }) {
			errs = append(errs, fmt.Errorf("--only: no image %q", n))
		}
	}
	if !tagRE.MatchString(o.version) {
		errs = append(errs, fmt.Errorf("--version %q is not a tag", o.version))
	}
	if _, ok := multiarch[runtime.GOARCH]; !ok {
		errs = append(errs, fmt.Errorf("architecture %s: images are built for amd64 and arm64 hosts", runtime.GOARCH))
	}
	return errors.Join(errs...)
}

// tagRE is what a registry accepts as a tag (distribution spec).
var tagRE = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)

func main() {
	o := newOptions()
	o.addFlags(flag.CommandLine)
	flag.Parse()
	if err := run(o); err != nil {
		fmt.Fprintln(os.Stderr, "images:", err)
		os.Exit(1)
	}
}

func git(repo string, args ...string) (string, error) {
	cmd := exec.Command("git", args...)
	cmd.Dir = repo
	out, err := cmd.Output()
	return strings.TrimSpace(string(out)), err
}

// sourceDate is SOURCE_DATE_EPOCH, else the time of the HEAD commit, else 0.
func sourceDate(repo string) (time.Time, error) {
	s := os.Getenv("SOURCE_DATE_EPOCH")
	if s == "" {
		s, _ = git(repo, "log", "-1", "--format=%ct")
	}
	if s == "" {
		return time.Unix(0, 0).UTC(), nil
	}
	sec, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("SOURCE_DATE_EPOCH %q: %w", s, err)
	}
	return time.Unix(sec, 0).UTC(), nil
}

func run(o *options) error {
	if err := o.validate(); err != nil {
		return err
	}
	if o.repo == "" {
		top, err := git(".", "rev-parse", "--show-toplevel")
		if err != nil {
			return fmt.Errorf("find the repository root (or pass --repo): %w", err)
		}
		o.repo = top
	}
	created, err := sourceDate(o.repo)
	if err != nil {
		return err
	}
	revision, _ := git(o.repo, "rev-parse", "HEAD")
	arch := multiarch[runtime.GOARCH]
	m := meta{source: o.source, version: o.version, revision: revision, registry: o.registry,
		created: created, arch: runtime.GOARCH}

	var build []target
	for _, t := range targets {
		if o.only == "" || slices.Contains(strings.Split(o.only, ","), t.Name) {
			build = append(build, t)
		}
	}
	lockPath := filepath.Join(o.repo, "tools/images/debian-packages.lock")
	var libc *debContents
	if o.updateLock {
		debs, err := updateLock(lockPath, o.cacheDir, arch.deb)
		if err != nil {
			return fmt.Errorf("update %s: %w", lockPath, err)
		}
		for _, d := range debs {
			fmt.Fprintf(os.Stderr, "locked %s %s\n", d, d.SHA256)
		}
	}
	if slices.ContainsFunc(build, func(t target) bool { return t.CGO }) {
		if libc, m.libcVersion, err = loadLibc(lockPath, o.cacheDir, arch.deb); err != nil {
			return err
		}
	}

	out := o.out
	if !filepath.IsAbs(out) {
		out = filepath.Join(o.repo, out)
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	work, err := os.MkdirTemp("", "pulse-images-")
	if err != nil {
		return err
	}
	defer removeAll(work)
	for _, t := range build {
		if err := buildOne(t, o, work, out, libc, m); err != nil {
			return err
		}
	}
	return nil
}

// buildOne builds t's image into out/<name>.tar (work: its binary's
// directory; libc: Debian's libc6, for a cgo target) and prints its line.
func buildOne(t target, o *options, work, out string, libc *debContents, m meta) error {
	bin, err := goBuild(t, o.repo, work, runtime.GOARCH, o.version)
	if err != nil {
		return err
	}
	var libcFs []file
	if t.CGO {
		if libcFs, err = libcFiles(libc, bin, multiarch[runtime.GOARCH].triplet); err != nil {
			return fmt.Errorf("%s: %w", t.Name, err)
		}
	}
	img, err := buildImage(specFor(t, bin, libcFs, m))
	if err != nil {
		return fmt.Errorf("%s: %w", t.Name, err)
	}
	p := filepath.Join(out, t.Name+".tar")
	if err := writeLayoutFile(p, img, m.indexAnnotations(t), m.created); err != nil {
		return fmt.Errorf("%s: %w", t.Name, err)
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	rel, err := filepath.Rel(o.repo, p)
	if err != nil {
		rel = p
	}
	fmt.Println(t.Name, m.ref(t), digest, rel)
	return nil
}

func loadLibc(lockPath, cacheDir, debArch string) (*debContents, string, error) {
	b, err := os.ReadFile(lockPath)
	if err != nil {
		return nil, "", fmt.Errorf("read the Debian package lock: %w", err)
	}
	debs, err := parseLock(bytes.NewReader(b))
	if err != nil {
		return nil, "", fmt.Errorf("%s: %w", lockPath, err)
	}
	d, err := lockFor(debs, "libc6", debArch)
	if err != nil {
		return nil, "", err
	}
	p, err := fetchDeb(d, cacheDir)
	if err != nil {
		return nil, "", err
	}
	c, err := readDeb(p)
	if err != nil {
		return nil, "", err
	}
	return c, d.Version, nil
}

// meta is what every image is labelled with.
type meta struct {
	source, version, revision, registry, libcVersion, arch string
	created                                                time.Time
}

func (m meta) ref(t target) string { return m.registry + "/" + t.Name + ":" + m.version }

// annotations go on the manifest and, as labels, in the config.
func (m meta) annotations(t target) map[string]string {
	a := map[string]string{
		annSource:      m.source,
		annVersion:     m.version,
		annCreated:     m.created.Format(time.RFC3339),
		annTitle:       t.Name,
		annDescription: t.Description,
	}
	if m.revision != "" {
		a[annRevision] = m.revision
	}
	return a
}

// indexAnnotations are the manifest's plus the names ctr import uses.
func (m meta) indexAnnotations(t target) map[string]string {
	a := m.annotations(t)
	a[annRefName] = m.version
	a[annContainerdRef] = m.ref(t)
	return a
}
