package kubetest

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// Versions built by hack/kube-bins.sh; keep in step with the script.
const (
	KubeVersion = "1.37.2"
	EtcdVersion = "v3.7.3"
)

// ErrNoBinaries means kube-apiserver or etcd is not available and building
// them was not requested (CI is not "true").
var ErrNoBinaries = errors.New("kube-apiserver/etcd binaries not found (run `make kube-bins` or set KVMESH_KUBE_BIN_DIR)")

// BinDir returns the directory holding kube-apiserver and etcd. Order:
// KVMESH_KUBE_BIN_DIR; the script's cache directory; and, only when CI=true,
// building them with hack/kube-bins.sh.
func BinDir() (string, error) {
	if d := os.Getenv("KVMESH_KUBE_BIN_DIR"); d != "" {
		if !hasBins(d) {
			return "", fmt.Errorf("KVMESH_KUBE_BIN_DIR=%s: no kube-apiserver and etcd there", d)
		}
		return d, nil
	}
	if d := cacheDir(); d != "" && hasBins(d) {
		return d, nil
	}
	if os.Getenv("CI") != "true" {
		return "", ErrNoBinaries
	}
	return build()
}

func cacheDir() string {
	base := os.Getenv("KVMESH_KUBE_CACHE")
	if base == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return ""
		}
		base = filepath.Join(home, ".cache", "kvmesh", "kube")
	}
	return filepath.Join(base, "k8s-"+KubeVersion+"-etcd-"+EtcdVersion)
}

func hasBins(dir string) bool {
	for _, b := range []string{"kube-apiserver", "etcd"} {
		fi, err := os.Stat(filepath.Join(dir, b))
		if err != nil || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// build runs hack/kube-bins.sh from the repository root and returns the
// directory it prints.
func build() (string, error) {
	root, err := repoRoot()
	if err != nil {
		return "", err
	}
	var out, errb bytes.Buffer
	cmd := exec.Command("bash", filepath.Join(root, "hack", "kube-bins.sh"))
	cmd.Dir = root
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		tail := errb.String()
		if len(tail) > 4000 {
			tail = tail[len(tail)-4000:]
		}
		return "", fmt.Errorf("hack/kube-bins.sh: %w\n%s", err, tail)
	}
	dir := strings.TrimSpace(out.String())
	if i := strings.LastIndexByte(dir, '\n'); i >= 0 {
		dir = dir[i+1:]
	}
	if !hasBins(dir) {
		return "", fmt.Errorf("hack/kube-bins.sh printed %q without both binaries", dir)
	}
	return dir, nil
}

// repoRoot walks up from the working directory to the go.mod of the module.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "hack", "kube-bins.sh")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("hack/kube-bins.sh not found above the working directory")
		}
		dir = parent
	}
}

// RepoFile is rel under the repository root; it fails t when there is no
// root.
func RepoFile(t testing.TB, rel string) string {
	t.Helper()
	root, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(root, rel)
}
