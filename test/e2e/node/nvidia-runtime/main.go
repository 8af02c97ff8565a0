// Command nvidia-runtime is the real-node e2e's stand-in for the NVIDIA
// container runtime: an OCI runtime that containerd's runc shim calls in
// runc's place (the runtime's BinaryName), which, for a container whose
// environment asks for GPUs (NVIDIA_VISIBLE_DEVICES, as pulse's agent chart
// and the device plugin set it), adds the driver's NVML library to the
// container's mounts, then runs runc with the same arguments. The NVIDIA
// runtime does the same with the real driver's libraries; here the library is
// the test's stub (PULSE_NVML_STUB, in containerd's environment).
package main

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// libPath is where the NVIDIA runtime puts libnvidia-ml.so.1 on a Debian
// or Ubuntu image: a directory glibc's loader searches.
const libPath = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "nvidia-runtime:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	runc, err := lookRunc()
	if err != nil {
		return err
	}
	if bundle := createBundle(args); bundle != "" {
		if err := inject(filepath.Join(bundle, "config.json"), os.Getenv("PULSE_NVML_STUB")); err != nil {
			return err
		}
	}
	return syscall.Exec(runc, append([]string{"runc"}, args...), os.Environ())
}

func lookRunc() (string, error) {
	for _, p := range []string{"/usr/sbin/runc", "/usr/bin/runc", "/usr/local/sbin/runc"} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		}
	}
	return "", fmt.Errorf("runc not found")
}

// createBundle returns the bundle of a `create` command, or "".
func createBundle(args []string) string {
	create := false
	bundle := ""
	for i, a := range args {
		switch {
		case a == "create":
			create = true
		case (a == "--bundle" || a == "-b") && i+1 < len(args):
			bundle = args[i+1]
		case strings.HasPrefix(a, "--bundle="):
			bundle = strings.TrimPrefix(a, "--bundle=")
		}
	}
	if !create {
		return ""
	}
	return bundle
}

// inject adds the library's bind mount to a container that asks for GPUs.
// The spec is edited as JSON, leaving what it does not know untouched.
func inject(config, lib string) error {
	b, err := os.ReadFile(config)
	if err != nil {
		return err
	}
	var spec map[string]any
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("%s: %w", config, err)
	}
	proc, _ := spec["process"].(map[string]any)
	env, _ := proc["env"].([]any)
	wants := false
	for _, e := range env {
		s, _ := e.(string)
		if v, ok := strings.CutPrefix(s, "NVIDIA_VISIBLE_DEVICES="); ok && v != "" && v != "void" && v != "none" {
			wants = true
		}
	}
	if !wants {
		return nil
	}
	if lib == "" {
		return fmt.Errorf("a container asks for GPUs and PULSE_NVML_STUB is not set")
	}
	mounts, _ := spec["mounts"].([]any)
	spec["mounts"] = append(mounts, map[string]any{
		"destination": libPath, "type": "bind", "source": lib,
		"options": []any{"rbind", "ro", "nosuid", "nodev"},
	})
	out, err := json.Marshal(spec)
	if err != nil {
		return err
	}
	return os.WriteFile(config, out, 0o600)
}
