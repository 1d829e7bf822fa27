package local

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// kvmeshBin is the kvmesh binary built once for this package's tests: the
// children are real `kvmesh sim`, `kvmesh sidecar` and `kvmesh ingress`.
var kvmeshBin string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "kvmesh-local-test-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	kvmeshBin = filepath.Join(dir, "kvmesh")
	out, err := exec.Command("go", "build", "-o", kvmeshBin, "github.com/kvmesh/kvmesh/cmd/kvmesh").CombinedOutput()
	if err != nil {
		fmt.Fprintf(os.Stderr, "build kvmesh: %v\n%s", err, out)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
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
