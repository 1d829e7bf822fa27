package local

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
	buildOut  []byte
)

// kvmeshBin builds the kvmesh binary once for this package's tests (the
// children are real `kvmesh sim`, `kvmesh sidecar` and `kvmesh ingress`).
// Lazily, so fuzz workers and the pure tests do not pay for the build.
func kvmeshBin(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		binDir, buildErr = os.MkdirTemp("", "kvmesh-local-test-*")
		if buildErr == nil {
			buildOut, buildErr = exec.Command("go", "build", "-o", filepath.Join(binDir, "kvmesh"), "github.com/kvmesh/kvmesh/cmd/kvmesh").CombinedOutput()
		}
	})
	if buildErr != nil {
		t.Fatalf("build kvmesh: %v\n%s", buildErr, buildOut)
	}
	return filepath.Join(binDir, "kvmesh")
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		os.RemoveAll(binDir)
	}
	os.Exit(code)
}

// alive reports whether pid is a running process (a zombie, reaped by
// nobody in a container without an init, counts as gone).
func alive(pid int) bool {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	return i < 0 || i+2 >= len(s) || s[i+2] != 'Z'
}

func noneAlive(t *testing.T, pids map[int]string) {
	t.Helper()
	for pid, what := range pids {
		if alive(pid) {
			t.Errorf("%s (pid %d) is still running", what, pid)
		}
	}
}
