package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// A test, fuzz target or benchmark named in a document, in code marks
	// (a subtest's name after a slash).
	testRef = regexp.MustCompile("`((?:Test|Fuzz|Benchmark)[A-Z0-9_][A-Za-z0-9_]*)(?:/[^`]*)?`")
	testDef = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Za-z0-9_]+)\(`)
)

// TestTestsNamedInDocumentsExist: every test, fuzz target and benchmark a
// tracked document names is defined in a tracked test file (the
// reliability table cited a test by a name it never had, and nothing said
// so).
func TestTestsNamedInDocumentsExist(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	files := repoFiles(t, root)
	defined := map[string]bool{}
	for _, f := range files {
		if !strings.HasSuffix(f, "_test.go") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testDef.FindAllStringSubmatch(string(raw), -1) {
			defined[m[1]] = true
		}
	}
	named := 0
	for _, f := range files {
		if filepath.Ext(f) != ".md" || strings.HasPrefix(f, "docs/simulation/results/") {
			continue
		}
		raw, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range testRef.FindAllStringSubmatch(string(raw), -1) {
			named++
			if !defined[m[1]] {
				t.Errorf("%s names %s, which no test file defines", f, m[1])
			}
		}
	}
	if named < 100 {
		t.Fatalf("%d tests named in the documents: the pattern no longer finds them", named)
	}
}
