package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// An API keys file that holds no key (only comments), or a
// $KVMESH_API_KEYS set to blanks, is a configuration error: exit 2 with a
// message naming it, not an ingress that serves everyone.
func TestIngressRefusesEmptyKeys(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "keys")
	if err := os.WriteFile(empty, []byte("# one key per line: name key\n\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("KVMESH_API_KEYS", "")
	os.Unsetenv("KVMESH_API_KEYS") // t.Setenv restores it afterwards
	base := []string{"ingress", "--listen", "127.0.0.1:0", "--engine", "m=http://127.0.0.1:1", "--log-level", "error"}
	refused := func(name, want string, args ...string) {
		t.Helper()
		var out, errOut testutil.SyncBuffer
		if code := run(append(append([]string(nil), base...), args...), &out, &errOut); code != 2 || !strings.Contains(errOut.String(), want) {
			t.Errorf("%s: exit %d: %s", name, code, errOut.String())
		}
	}
	refused("comments-only --api-keys-file", "holds no key", "--api-keys-file", empty)
	refused("--cors-origins with a trailing slash", `"https://app.example/"`, "--cors-origins", "https://app.example/")
	t.Setenv("KVMESH_API_KEYS", " ")
	refused("blank $KVMESH_API_KEYS", "KVMESH_API_KEYS is set but holds no key")
}
