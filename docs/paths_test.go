// Package docs holds no code: its test keeps the documentation honest about
// the tree.
package docs

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

var (
	// code spans and link targets: where the docs name files and folders.
	codeSpan   = regexp.MustCompile("`([^`\n]+)`")
	linkTarget = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	// a repository path: segments of file-name characters, maybe a trailing
	// slash, maybe ":line" or "#anchor" after it.
	pathLike = regexp.MustCompile(`^([A-Za-z0-9_.\-]+(?:/[A-Za-z0-9_.\-*]+)*/?)(?::[0-9\-,]+)?(?:#.*)?$`)
	goIdent  = regexp.MustCompile(`(\.[A-Z]\w*)+$`)
	// notInTree are names that look like repository paths but are not.
	notInTree = map[string]string{
		"test/data": "a folder of the github.com/daulet/tokenizers module (TOKENIZER.md)",
		"docs/kthena/docs/user-guide/kvcache-aware.md": "a file of the volcano-sh/kthena repository (EMULATIONS.md)",
	}
)

// TestPathsExist: every file or folder README.md and docs/*.md name (in a
// code span or a link) exists, so a move or rename cannot leave the docs
// pointing at nothing. A name counts as a repository path when its first
// segment is a top-level entry of the repository; relative links count
// from the document's folder.
func TestPathsExist(t *testing.T) {
	root := ".."
	top := map[string]bool{}
	entries, err := os.ReadDir(root)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		// bin/ is build output (.gitignore): `make chaos` creates it
		// without bin/kvmesh, and a clean clone has none.
		if !strings.HasPrefix(e.Name(), ".") && e.Name() != "bin" {
			top[e.Name()] = true
		}
	}
	docs, _ := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	docs = append(docs, filepath.Join(root, "README.md"), filepath.Join(root, "loadtest", "README.md"))
	checked := 0
	for _, doc := range docs {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		rel, _ := filepath.Rel(root, doc)
		for _, m := range linkTarget.FindAllStringSubmatch(string(b), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "#") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			p := pathLike.FindStringSubmatch(target)
			if p == nil {
				continue
			}
			checked++
			if _, err := os.Stat(filepath.Join(filepath.Dir(doc), p[1])); err != nil {
				t.Errorf("%s links to %s, which does not exist", rel, target)
			}
		}
		for _, m := range codeSpan.FindAllStringSubmatch(string(b), -1) {
			for _, word := range strings.Fields(m[1]) {
				p := pathLike.FindStringSubmatch(strings.Trim(word, ",;()"))
				if p == nil || notInTree[p[1]] != "" {
					continue
				}
				first, rest, nested := strings.Cut(p[1], "/")
				// "dir/..." under a top-level entry, or "dir/" alone: a
				// folder the docs say is at the top.
				if !(nested && top[first]) && !(nested && rest == "") {
					continue
				}
				checked++
				// "sim/simtest.StartPD" and "scheduler/pd.Router.Route" name Go
				// identifiers in a package folder.
				name := goIdent.ReplaceAllString(p[1], "")
				if matches, _ := filepath.Glob(filepath.Join(root, name)); len(matches) == 0 {
					t.Errorf("%s names %s, which does not exist", rel, word)
				}
			}
		}
	}
	if checked < 50 {
		t.Fatalf("only %d paths checked: the patterns no longer find them", checked)
	}
}
