package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

var testMeta = meta{
	source:   "https://github.com/pulse-io/pulse",
	version:  "v1.2.3",
	revision: "0123456789abcdef0123456789abcdef01234567",
	registry: "ghcr.io/pulse-io",
	arch:     "amd64",
	created:  time.Unix(1700000000, 0).UTC(),
}

// testLibc stands in for the libc6 files: a library, the loader's link to
// it, the status entry.
func testLibc() []file {
	return []file{
		regular("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", 0o755, []byte("loader")),
		symlink("/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
		regular("/var/lib/dpkg/status.d/libc6", 0o644, []byte("Package: libc6\n")),
	}
}

func targetNamed(t *testing.T, name string) target {
	t.Helper()
	for _, tg := range targets {
		if tg.Name == name {
			return tg
		}
	}
	t.Fatalf("no target %s", name)
	return target{}
}

// layoutBytes builds the image of spec and its layout tarball.
func layoutBytes(t *testing.T, tg target, spec imageSpec) (v1.Hash, []byte) {
	t.Helper()
	img, err := buildImage(spec)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := writeLayout(&buf, img, testMeta.indexAnnotations(tg), testMeta.created); err != nil {
		t.Fatal(err)
	}
	d, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d, buf.Bytes()
}

func TestReproducible(t *testing.T) {
	agent := targetNamed(t, "pulse-agent")
	bin := []byte("\x7fELF not really a binary")
	reversed := testLibc()
	for i, j := 0, len(reversed)-1; i < j; i, j = i+1, j-1 {
		reversed[i], reversed[j] = reversed[j], reversed[i]
	}
	tests := map[string]struct {
		a, b imageSpec
		same bool
	}{
		"same inputs": {
			a: specFor(agent, bin, testLibc(), testMeta), b: specFor(agent, bin, testLibc(), testMeta), same: true,
		},
		"files listed in another order": {
			a: specFor(agent, bin, testLibc(), testMeta), b: specFor(agent, bin, reversed, testMeta), same: true,
		},
		"another binary": {
			a: specFor(agent, bin, testLibc(), testMeta), b: specFor(agent, append(bin, '!'), testLibc(), testMeta),
		},
		"another time": {
			a: specFor(agent, bin, testLibc(), testMeta),
			b: specFor(agent, bin, testLibc(), meta{created: testMeta.created.Add(time.Second), arch: "amd64"}),
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			da, la := layoutBytes(t, agent, tc.a)
			db, lb := layoutBytes(t, agent, tc.b)
			if got := da == db; got != tc.same {
				t.Errorf("digests %s and %s: same = %v, want %v", da, db, got, tc.same)
			}
			if got := bytes.Equal(la, lb); got != tc.same {
				t.Errorf("layout tarballs equal = %v, want %v", got, tc.same)
			}
		})
	}
}

// tarHeaders reads every header of a tar stream, with each file's data.
func tarHeaders(t *testing.T, r io.Reader) (map[string]*tar.Header, map[string][]byte) {
	t.Helper()
	hdrs, data := map[string]*tar.Header{}, map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return hdrs, data
		}
		if err != nil {
			t.Fatal(err)
		}
		hdrs[h.Name] = h
		if data[h.Name], err = io.ReadAll(tr); err != nil {
			t.Fatal(err)
		}
	}
}

// readLayout unpacks a layout tarball and opens its one image.
func readLayout(t *testing.T, b []byte) (v1.Descriptor, v1.Image) {
	t.Helper()
	hdrs, data := tarHeaders(t, bytes.NewReader(b))
	dir := t.TempDir()
	for name, h := range hdrs {
		if h.ModTime.Unix() != testMeta.created.Unix() || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("layout entry %s: mtime %v, owner %d:%d %q:%q; want %v, 0:0 with no names",
				name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname, testMeta.created)
		}
		p := filepath.Join(dir, name)
		if h.Typeflag == tar.TypeDir {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, data[name], 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 {
		t.Fatalf("index.json lists %d manifests, want 1", len(im.Manifests))
	}
	img, err := idx.Image(im.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if err := validate.Image(img); err != nil {
		t.Fatalf("validate image: %v", err)
	}
	return im.Manifests[0], img
}

func TestImageContents(t *testing.T) {
	type entry struct {
		typ  byte
		mode int64
		link string
	}
	base := map[string]entry{
		"etc/":       {tar.TypeDir, 0o755, ""},
		"etc/group":  {tar.TypeReg, 0o644, ""},
		"etc/passwd": {tar.TypeReg, 0o644, ""},
		"tmp/":       {tar.TypeDir, 0o1777, ""},
	}
	withLibc := map[string]entry{
		"etc/os-release":        {tar.TypeReg, 0o644, ""},
		"lib/":                  {tar.TypeDir, 0o755, ""},
		"lib/x86_64-linux-gnu/": {tar.TypeDir, 0o755, ""},
		"lib/x86_64-linux-gnu/ld-linux-x86-64.so.2": {tar.TypeReg, 0o755, ""},
		"lib64/":                      {tar.TypeDir, 0o755, ""},
		"lib64/ld-linux-x86-64.so.2":  {tar.TypeSymlink, 0o777, "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"},
		"var/":                        {tar.TypeDir, 0o755, ""},
		"var/lib/":                    {tar.TypeDir, 0o755, ""},
		"var/lib/dpkg/":               {tar.TypeDir, 0o755, ""},
		"var/lib/dpkg/status.d/":      {tar.TypeDir, 0o755, ""},
		"var/lib/dpkg/status.d/libc6": {tar.TypeReg, 0o644, ""},
	}
	for k, v := range base {
		withLibc[k] = v
	}
	libc := append(testLibc(), regular("/etc/os-release", 0o644, []byte(osRelease)))
	tests := map[string]struct {
		libc   []file
		user   string
		layers []map[string]entry
	}{
		"pulse-agent":      {libc: libc, user: "0:0", layers: []map[string]entry{withLibc, {"pulse-agent": {tar.TypeReg, 0o755, ""}}}},
		"pulse-aggregator": {user: "65532:65532", layers: []map[string]entry{base, {"pulse-aggregator": {tar.TypeReg, 0o755, ""}}}},
		"vllm-sim":         {user: "65532:65532", layers: []map[string]entry{base, {"vllm-sim": {tar.TypeReg, 0o755, ""}}}},
		"pause":            {user: "65535:65535", layers: []map[string]entry{{"pause": {tar.TypeReg, 0o755, ""}}}},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			tg := targetNamed(t, name)
			bin := []byte("binary of " + name)
			_, b := layoutBytes(t, tg, specFor(tg, bin, tc.libc, testMeta))
			desc, img := readLayout(t, b)

			wantAnn := map[string]string{
				annSource:      testMeta.source,
				annVersion:     "v1.2.3",
				annRevision:    testMeta.revision,
				annCreated:     "2023-11-14T22:13:20Z",
				annTitle:       name,
				annDescription: tg.Description,
			}
			m, err := img.Manifest()
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(m.Annotations, wantAnn) {
				t.Errorf("manifest annotations = %v, want %v", m.Annotations, wantAnn)
			}
			wantIndex := map[string]string{annRefName: "v1.2.3", annContainerdRef: "ghcr.io/pulse-io/" + name + ":v1.2.3"}
			for k, v := range wantAnn {
				wantIndex[k] = v
			}
			if !reflect.DeepEqual(desc.Annotations, wantIndex) {
				t.Errorf("index annotations = %v, want %v", desc.Annotations, wantIndex)
			}
			if desc.Platform == nil || desc.Platform.OS != "linux" || desc.Platform.Architecture != "amd64" {
				t.Errorf("index platform = %v, want linux/amd64", desc.Platform)
			}

			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			if got, want := cf.Config.User, tc.user; got != want {
				t.Errorf("user = %q, want %q", got, want)
			}
			if got, want := cf.Config.Entrypoint, []string{"/" + name}; !reflect.DeepEqual(got, want) {
				t.Errorf("entrypoint = %q, want %q", got, want)
			}
			if !reflect.DeepEqual(cf.Config.Labels, wantAnn) {
				t.Errorf("labels = %v, want %v", cf.Config.Labels, wantAnn)
			}
			if !cf.Created.Equal(testMeta.created) || cf.OS != "linux" || cf.Architecture != "amd64" {
				t.Errorf("config created %v %s/%s, want %v linux/amd64", cf.Created, cf.OS, cf.Architecture, testMeta.created)
			}
			if len(cf.History) != len(tc.layers) {
				t.Errorf("history has %d entries, want %d", len(cf.History), len(tc.layers))
			}
			for _, h := range cf.History {
				if !h.Created.Equal(testMeta.created) {
					t.Errorf("history %q created %v, want %v", h.CreatedBy, h.Created, testMeta.created)
				}
			}

			layers, err := img.Layers()
			if err != nil {
				t.Fatal(err)
			}
			if len(layers) != len(tc.layers) {
				t.Fatalf("%d layers, want %d", len(layers), len(tc.layers))
			}
			for i, l := range layers {
				rc, err := l.Uncompressed()
				if err != nil {
					t.Fatal(err)
				}
				hdrs, data := tarHeaders(t, rc)
				rc.Close()
				got := map[string]entry{}
				for p, h := range hdrs {
					got[p] = entry{h.Typeflag, h.Mode, h.Linkname}
					if h.ModTime.Unix() != testMeta.created.Unix() || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
						t.Errorf("layer %d %s: mtime %v, owner %d:%d %q:%q", i, p, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname)
					}
				}
				if !reflect.DeepEqual(got, tc.layers[i]) {
					t.Errorf("layer %d entries:\n got %v\nwant %v", i, got, tc.layers[i])
				}
				if d, ok := data[name]; ok && !bytes.Equal(d, bin) {
					t.Errorf("layer %d /%s holds %q, want %q", i, name, d, bin)
				}
			}
		})
	}
}
