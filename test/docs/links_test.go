// Package docs checks that the documentation's references resolve.
package docs

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// repoFiles lists the repository's tracked files (git ls-files) under the
// root, relative to it.
func repoFiles(t *testing.T, root string) []string {
	t.Helper()
	out, err := exec.Command("git", "-C", root, "ls-files").Output()
	if err != nil {
		t.Skipf("git ls-files: %v (not a git checkout)", err)
	}
	return strings.Fields(string(out))
}

var (
	heading = regexp.MustCompile("(?m)^#{1,6} +(.+?) *$")
	// A markdown link to a relative path, with an optional anchor.
	mdLink = regexp.MustCompile(`\]\(([^)#\s]*)(#[^)\s]*)?\)`)
	// The house's reference to a section: a document's path, then the
	// section's title in quotes (docs/scaledobject.md, "Choosing a
	// threshold").
	// README without .md is the top README (not another directory's:
	// the character before it is no path's).
	sectionRef = regexp.MustCompile("((?:docs/[A-Za-z0-9_./-]+|deploy/[a-z]+/README)\\.md|(?:^|[^/\\w.-])README(?:\\.md)?)`?\\)?,? +\"([^\"]+)\"")
	nonSlug    = regexp.MustCompile(`[^\p{L}\p{N} _-]`)
)

var (
	// A quoted title may wrap over lines of a comment or a paragraph.
	wrap = regexp.MustCompile(`\s*\n\s*(?:(?://|#)\s*)?`)
	// A heading's "(a) " label and trailing "(make fleet)", which
	// references may leave out.
	label    = regexp.MustCompile(`^\([a-z0-9]+\) +`)
	trailing = regexp.MustCompile(` +\([^)]*\)$`)
)

// title is a heading's text as a reader quotes it: on one line, without
// markdown code marks.
func title(h string) string {
	return strings.TrimSpace(strings.ReplaceAll(wrap.ReplaceAllString(h, " "), "`", ""))
}

// slug is GitHub's anchor for a heading.
func slug(h string) string {
	s := strings.ToLower(title(h))
	s = nonSlug.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}

// TestReferencesResolve: every relative markdown link in a tracked document
// names a file that exists (and, with an anchor, a heading of it), and every
// reference to a document's section by its quoted title — in documents,
// Go comments, chart templates and values — names a heading the document
// has (a link to a README section that does not exist once sent readers
// nowhere).
func TestReferencesResolve(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	titles := map[string]map[string]bool{} // document → its headings' titles and slugs
	headingsOf := func(doc string) map[string]bool {
		if h, ok := titles[doc]; ok {
			return h
		}
		h := map[string]bool{}
		if raw, err := os.ReadFile(filepath.Join(root, doc)); err == nil {
			for _, m := range heading.FindAllStringSubmatch(string(raw), -1) {
				tt := strings.ToLower(title(m[1]))
				// Quoted as written, without its "(a) " label, or up to its
				// colon ("The benchmark" for "The benchmark: pulse-sim bench").
				h[tt] = true
				h[label.ReplaceAllString(tt, "")] = true
				h[trailing.ReplaceAllString(tt, "")] = true
				if before, _, ok := strings.Cut(tt, ":"); ok {
					h[before] = true
				}
				h["#"+slug(m[1])] = true
			}
		} else {
			h = nil
		}
		titles[doc] = h
		return h
	}
	checked := 0
	for _, f := range repoFiles(t, root) {
		ext := filepath.Ext(f)
		if ext != ".md" && ext != ".go" && ext != ".yaml" && ext != ".txt" && ext != ".tpl" {
			continue
		}
		if strings.HasPrefix(f, "docs/simulation/results/") {
			continue // command output, not prose
		}
		raw, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		text := string(raw)
		if ext == ".md" {
			for _, m := range mdLink.FindAllStringSubmatch(text, -1) {
				target, anchor := m[1], m[2]
				if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
					continue
				}
				doc := f
				if target != "" {
					doc = filepath.ToSlash(filepath.Join(filepath.Dir(f), target))
					if _, err := os.Stat(filepath.Join(root, doc)); err != nil {
						t.Errorf("%s: link to %s: no such file", f, target)
						continue
					}
				}
				checked++
				if anchor != "" && strings.HasSuffix(doc, ".md") && !headingsOf(doc)[strings.ToLower(anchor)] {
					t.Errorf("%s: link to %s%s: %s has no such heading", f, target, anchor, doc)
				}
			}
		}
		checked += checkSectionRefs(t, f, text, headingsOf)
	}
	if checked == 0 {
		t.Fatal("no reference found: the patterns are wrong")
	}
	t.Logf("%d references checked", checked)
}

// checkSectionRefs checks file f's references to sections (sectionRef)
// against headingsOf each document's headings (nil: no such document),
// and returns how many it checked.
func checkSectionRefs(t *testing.T, f, text string, headingsOf func(string) map[string]bool) int {
	t.Helper()
	checked := 0
	for _, m := range sectionRef.FindAllStringSubmatch(text, -1) {
		doc, section := m[1], strings.ToLower(title(m[2]))
		if !strings.HasPrefix(doc, "docs/") && !strings.HasPrefix(doc, "deploy/") {
			doc = "README.md" // the bare form, with the character before it
		}
		h := headingsOf(doc)
		checked++
		if h == nil {
			t.Errorf("%s: refers to %s, which does not exist", f, doc)
			continue
		}
		if !h[section] {
			t.Errorf("%s: refers to %s, %q: no such heading", f, doc, m[2])
		}
	}
	return checked
}
