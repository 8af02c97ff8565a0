package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// OCI annotation keys (image-spec annotations.md) and containerd's, which
// `ctr images import` names an image by.
const (
	annSource        = "org.opencontainers.image.source"
	annVersion       = "org.opencontainers.image.version"
	annRevision      = "org.opencontainers.image.revision"
	annCreated       = "org.opencontainers.image.created"
	annTitle         = "org.opencontainers.image.title"
	annDescription   = "org.opencontainers.image.description"
	annRefName       = "org.opencontainers.image.ref.name"
	annContainerdRef = "io.containerd.image.name"
)

// A layerSpec is one layer: its files and the history line that says what
// it is.
type layerSpec struct {
	Comment string
	Files   []file
}

// An imageSpec is everything one image is made of.
type imageSpec struct {
	Layers      []layerSpec
	OS, Arch    string
	User        string
	Entrypoint  []string
	Env         []string
	Created     time.Time
	Annotations map[string]string // on the manifest and as config labels
}

// buildImage assembles spec as an OCI image: gzip layers, an OCI config
// whose created, history and labels come from spec alone.
func buildImage(spec imageSpec) (v1.Image, error) {
	created := v1.Time{Time: spec.Created.UTC()}
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, ls := range spec.Layers {
		raw, err := layerTar(ls.Files, spec.Created)
		if err != nil {
			return nil, fmt.Errorf("layer %q: %w", ls.Comment, err)
		}
		gz, err := gzipBytes(raw)
		if err != nil {
			return nil, fmt.Errorf("layer %q: %w", ls.Comment, err)
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(gz)), nil
		}, tarball.WithMediaType(types.OCILayer))
		if err != nil {
			return nil, fmt.Errorf("layer %q: %w", ls.Comment, err)
		}
		img, err = mutate.Append(img, mutate.Addendum{
			Layer:     l,
			MediaType: types.OCILayer,
			History:   v1.History{Created: created, CreatedBy: ls.Comment, Comment: "pulse tools/images"},
		})
		if err != nil {
			return nil, fmt.Errorf("append layer %q: %w", ls.Comment, err)
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = spec.OS, spec.Arch
	cf.Created = created
	cf.Config = v1.Config{
		User:       spec.User,
		Entrypoint: spec.Entrypoint,
		Env:        spec.Env,
		Labels:     spec.Annotations,
	}
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		return nil, fmt.Errorf("set config: %w", err)
	}
	annotated, ok := mutate.Annotations(img, spec.Annotations).(v1.Image)
	if !ok {
		return nil, fmt.Errorf("annotate image: not an image")
	}
	return annotated, nil
}

// writeLayout writes img as an OCI image layout (oci-layout, index.json,
// blobs/sha256/…), made by go-containerregistry's layout package, in one tar
// stream: sorted, with fixed times and owners. The index entry carries
// annotations (the manifest's, plus the reference names), so that `ctr
// images import` names the image.
func writeLayout(w io.Writer, img v1.Image, indexAnnotations map[string]string, mtime time.Time) error {
	cf, err := img.ConfigFile()
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	root, err := os.MkdirTemp("", "pulse-layout-")
	if err != nil {
		return err
	}
	defer removeAll(root)
	lp, err := layout.Write(root, empty.Index)
	if err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(indexAnnotations),
		layout.WithPlatform(v1.Platform{OS: cf.OS, Architecture: cf.Architecture})); err != nil {
		return fmt.Errorf("layout: %w", err)
	}
	// WalkDir visits in lexical order: the entries come sorted.
	var entries []tarEntry
	err = filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == root {
			return err
		}
		name := filepath.ToSlash(strings.TrimPrefix(p, root+string(filepath.Separator)))
		if d.IsDir() {
			entries = append(entries, tarEntry{name: name + "/", file: dir("/"+name, 0o755)})
			return nil
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		entries = append(entries, tarEntry{name: name, file: file{Type: tar.TypeReg, Mode: 0o644, Data: b}})
		return nil
	})
	if err != nil {
		return fmt.Errorf("read the layout: %w", err)
	}
	b, err := writeTar(entries, mtime)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// writeLayoutFile writes the layout tarball to p, replacing it only once
// it is complete.
func writeLayoutFile(p string, img v1.Image, ann map[string]string, mtime time.Time) error {
	tmp := p + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	if err := writeLayout(f, img, ann, mtime); err != nil {
		_ = f.Close()
		_ = os.Remove(tmp)
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, p)
}
