package tokenizer

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/dlclark/regexp2"
)

func TestDbgCorpus(t *testing.T) {
	dir := os.Getenv("CORPUS")
	files, _ := filepath.Glob(filepath.Join(dir, "*"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		lines := strings.Split(string(b), "\n")
		s, err := strconv.Unquote(strings.TrimSuffix(strings.TrimPrefix(lines[1], "string("), ")"))
		if err != nil {
			continue
		}
		for _, p := range []string{llama3Pattern, gpt2Pattern} {
			start := time.Now()
			done := make(chan bool)
			go func() {
				(&regexMatcher{re: regexp2.MustCompile(p, regexp2.Unicode)}).appendMatches(nil, s)
				llama3Matcher{3}.appendMatches(nil, s)
				gpt2Matcher{}.appendMatches(nil, s)
				close(done)
			}()
			select {
			case <-done:
			case <-time.After(2 * time.Second):
				t.Fatalf("hang on %q pattern %.20q", s, p)
			}
			_ = start
		}
	}
}
