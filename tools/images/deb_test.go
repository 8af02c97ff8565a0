package main

import (
	"bytes"
	"debug/elf"
	"os"
	"reflect"
	"strings"
	"testing"
)

const testSum = "ba4f88f73dbc3ae9055f3c20f4523bfdbaf1ad13ff95e258924f77d20b4fbedf"

func TestParseLock(t *testing.T) {
	tests := map[string]struct {
		in      string
		want    []lockedDeb
		wantErr string
	}{
		"comments and blank lines": {
			in:   "# header\n\nlibc6 2.36-9+deb12u14 amd64 " + testSum + "\n",
			want: []lockedDeb{{Package: "libc6", Version: "2.36-9+deb12u14", Arch: "amd64", SHA256: testSum}},
		},
		"missing field": {in: "libc6 2.36 amd64\n", wantErr: "line 1"},
		"bad sha256":    {in: "libc6 2.36 amd64 xyz\n", wantErr: "not a sha256"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := parseLock(strings.NewReader(tc.in))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one containing %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLockRoundTrip(t *testing.T) {
	debs := []lockedDeb{
		{Package: "libc6", Version: "2.36-9+deb12u14", Arch: "amd64", SHA256: testSum},
		{Package: "libc6", Version: "2.36-9+deb12u14", Arch: "arm64", SHA256: testSum},
	}
	got, err := parseLock(strings.NewReader(string(formatLock(debs))))
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, debs) {
		t.Errorf("got %v, want %v", got, debs)
	}
	d, err := lockFor(got, "libc6", "arm64")
	if err != nil || d.Arch != "arm64" {
		t.Errorf("lockFor arm64 = %v, %v", d, err)
	}
	if _, err := lockFor(got, "libc6", "riscv64"); err == nil {
		t.Error("lockFor riscv64: want an error")
	}
}

func TestResolve(t *testing.T) {
	c := &debContents{Files: map[string]file{}}
	for _, f := range []file{
		regular("/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2", 0o755, nil),
		symlink("/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"),
		symlink("/lib/x86_64-linux-gnu/libx.so", "libx.so.1"),
		regular("/lib/x86_64-linux-gnu/libx.so.1", 0o644, nil),
		symlink("/loop", "/loop"),
	} {
		c.Files[f.Path] = f
	}
	tests := map[string]struct {
		path    string
		want    []string
		wantErr bool
	}{
		"regular file":  {path: "/lib/x86_64-linux-gnu/libx.so.1", want: []string{"/lib/x86_64-linux-gnu/libx.so.1"}},
		"absolute link": {path: "/lib64/ld-linux-x86-64.so.2", want: []string{"/lib64/ld-linux-x86-64.so.2", "/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2"}},
		"relative link": {path: "/lib/x86_64-linux-gnu/libx.so", want: []string{"/lib/x86_64-linux-gnu/libx.so", "/lib/x86_64-linux-gnu/libx.so.1"}},
		"missing":       {path: "/nope", wantErr: true},
		"link loop":     {path: "/loop", wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fs, err := c.resolve(tc.path)
			if tc.wantErr {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, f := range fs {
				got = append(got, f.Path)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

func TestLayerTarRejects(t *testing.T) {
	tests := map[string][]file{
		"relative path": {regular("etc/passwd", 0o644, nil)},
		"root":          {dir("/", 0o755)},
		"listed twice":  {regular("/a", 0o644, nil), regular("/a/", 0o644, nil)},
	}
	for name, files := range tests {
		t.Run(name, func(t *testing.T) {
			if _, err := layerTar(files, testMeta.created); err == nil {
				t.Error("want an error")
			}
		})
	}
}

// TestCheckVersions runs on a glibc system: /bin/true needs versions of
// libc.so.6 that the host's libc defines and that an executable does not.
func TestCheckVersions(t *testing.T) {
	bin, err := os.ReadFile("/bin/true")
	if err != nil {
		t.Skip("no /bin/true")
	}
	libc, err := os.ReadFile("/lib/x86_64-linux-gnu/libc.so.6")
	if err != nil {
		t.Skip("no x86_64 glibc")
	}
	tests := map[string]struct {
		libc    []byte
		wantErr bool
	}{
		"the host's libc":         {libc: libc},
		"a libc with no versions": {libc: bin, wantErr: true},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			ef, err := elf.NewFile(bytes.NewReader(bin))
			if err != nil {
				t.Fatal(err)
			}
			defer closeELF(ef)
			err = checkVersions(ef, map[string][]byte{"libc.so.6": tc.libc})
			if (err != nil) != tc.wantErr {
				t.Errorf("err = %v, want an error: %v", err, tc.wantErr)
			}
		})
	}
}
