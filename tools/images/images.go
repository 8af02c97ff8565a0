package main

import (
	"bytes"
	"debug/elf"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// A target is one image: the binary it holds and how it is built.
type target struct {
	Name        string // image name and binary name: /<Name>
	Package     string // go build package, from the repository root
	CGO         bool   // cgo: glibc and the loader come from libc6
	Version     bool   // -X …/pkg/version.Version and -tags grpcnotrace, as the Makefile builds it
	User        string
	Description string
}

var targets = []target{
	{Name: "pulse-agent", Package: "./cmd/agent", CGO: true, Version: true, User: "0:0",
		Description: "pulse agent: scrapes the vLLM pods of its node and streams their values to the aggregators"},
	{Name: "pulse-aggregator", Package: "./cmd/aggregator", Version: true, User: "65532:65532",
		Description: "pulse aggregator: per-pod state and the KEDA external-push scaler"},
	{Name: "pulse-relay", Package: "./cmd/relay", Version: true, User: "65532:65532",
		Description: "pulse relay: carries many agents' streams to each aggregator replica on a few connections"},
	{Name: "vllm-sim", Package: "./test/vllmsim/cmd/vllm-sim", User: "65532:65532",
		Description: "simulated vLLM /metrics server for pulse's tests and demos"},
	{Name: "pause", Package: "./test/e2e/pause", User: "65535:65535",
		Description: "pause container: the sandbox image of pulse's e2e containerd"},
}

// nvmlNeeds are what libnvidia-ml.so.1 needs of glibc beyond libc and the
// loader. The agent dlopens it (so neither ldd nor DT_NEEDED shows it), and
// the NVIDIA container toolkit mounts it into the container without its
// dependencies: drivers' libnvidia-ml.so NEEDs libpthread.so.0 and
// libdl.so.2 (and nvidia-smi of the same drivers librt.so.1); libm.so.6 is
// there for drivers that use it. In glibc 2.34+ the first three are small
// stubs; libm is about 0.9 MB.
var nvmlNeeds = []string{"libpthread.so.0", "libdl.so.2", "librt.so.1", "libm.so.6"}

// multiarch maps GOARCH to Debian's architecture and multiarch triplet.
var multiarch = map[string]struct{ deb, triplet string }{
	"amd64": {"amd64", "x86_64-linux-gnu"},
	"arm64": {"arm64", "aarch64-linux-gnu"},
}

// goBuild builds t from repo into dir and returns the binary's bytes.
func goBuild(t target, repo, dir, goarch, version string) ([]byte, error) {
	out := filepath.Join(dir, t.Name)
	ldflags := "-s -w"
	args := []string{"build", "-trimpath", "-buildvcs=false"}
	if t.Version {
		ldflags += " -X github.com/pulse-io/pulse/pkg/version.Version=" + version
		args = append(args, "-tags", "grpcnotrace")
	}
	args = append(args, "-ldflags", ldflags, "-o", out, t.Package)
	cmd := exec.Command("go", args...)
	cmd.Dir = repo
	cgo := "0"
	if t.CGO {
		cgo = "1"
	}
	cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOOS=linux", "GOARCH="+goarch, "GOWORK=off")
	if b, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("go %s: %w\n%s", strings.Join(args, " "), err, b)
	}
	b, err := os.ReadFile(out)
	if err != nil {
		return nil, err
	}
	ef, err := elf.NewFile(bytes.NewReader(b))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", t.Name, err)
	}
	defer closeELF(ef)
	if static := progInterp(ef) == ""; static == t.CGO {
		return nil, fmt.Errorf("%s: built with CGO_ENABLED=%s but static is %v", t.Name, cgo, static)
	}
	return b, nil
}

// passwd and group are distroless's, less its other users: root, nobody,
// and nonroot (65532), the user the static images run as.
const (
	passwd = "root:x:0:0:root:/root:/sbin/nologin\n" +
		"nobody:x:65534:65534:nobody:/nonexistent:/sbin/nologin\n" +
		"nonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"
	group = "root:x:0:\nnobody:x:65534:\nnonroot:x:65532:\n"
	// osRelease tells scanners that the packages in status.d are Debian
	// 12's, as distroless's does.
	osRelease = "PRETTY_NAME=\"pulse (Debian GNU/Linux 12 packages)\"\nNAME=\"Debian GNU/Linux\"\n" +
		"ID=debian\nVERSION_ID=\"12\"\nVERSION_CODENAME=bookworm\nHOME_URL=\"https://github.com/pulse-io/pulse\"\n"
)

// baseFiles are what every image but pause has beside its binary.
func baseFiles() []file {
	return []file{
		regular("/etc/passwd", 0o644, []byte(passwd)),
		regular("/etc/group", 0o644, []byte(group)),
		dir("/tmp", 0o1777),
	}
}

// libcFiles are the files of the libc6 package that binary needs, its
// copyright, and its dpkg status entry, where scanners look for it.
func libcFiles(deb *debContents, binary []byte, triplet string) ([]file, error) {
	fs, err := deb.runtimeFiles(binary, triplet, nvmlNeeds)
	if err != nil {
		return nil, fmt.Errorf("libc6: %w", err)
	}
	copyright, err := deb.resolve("/usr/share/doc/libc6/copyright")
	if err != nil {
		return nil, fmt.Errorf("libc6: %w", err)
	}
	fs = append(fs, copyright...)
	return append(fs,
		regular("/var/lib/dpkg/status.d/libc6", 0o644, deb.Control),
		regular("/etc/os-release", 0o644, []byte(osRelease)),
	), nil
}

// defaultEnv is distroless's PATH.
var defaultEnv = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}

// specFor is t's image: a base layer (none for pause) and the binary's.
// libc holds the libc6 files the agent needs (nil for static binaries).
func specFor(t target, binary []byte, libc []file, m meta) imageSpec {
	var layers []layerSpec
	if t.Name != "pause" {
		base := layerSpec{Comment: "passwd, group, /tmp", Files: baseFiles()}
		if libc != nil {
			base.Comment = "passwd, group, /tmp; libc6 " + m.libcVersion + ": loader, libc and what NVML needs"
			base.Files = append(base.Files, libc...)
		}
		layers = append(layers, base)
	}
	layers = append(layers, layerSpec{Comment: "/" + t.Name, Files: []file{regular("/"+t.Name, 0o755, binary)}})
	return imageSpec{
		Layers:      layers,
		OS:          "linux",
		Arch:        m.arch,
		User:        t.User,
		Entrypoint:  []string{"/" + t.Name},
		Env:         defaultEnv,
		Created:     m.created,
		Annotations: m.annotations(t),
	}
}
