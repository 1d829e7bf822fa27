package kubetest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// shared is the package's server, started by the first Shared call of a
// test binary that runs Main.
var (
	sharedOpts Options
	mainRan    bool // Main is running the tests: it stops what Shared starts
	sharedOnce sync.Once
	shared     *Server
	sharedErr  error
	nsSeq      atomic.Int64
)

// Main runs a test package against one shared API server (starting it costs
// 10–60 s, so a package starts one): call it from TestMain as
//
//	func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, kubetest.Options{})) }
//
// Tests get the server with Shared(t); the first call starts it, so a run
// whose tests need none (`-run` of other tests, a fuzzing worker, which runs
// TestMain too and is killed, not stopped) starts none. When the binaries are
// missing and CI is not "true", tests that call Shared are skipped; every
// other start-up failure fails them.
func Main(m *testing.M, opts Options) int {
	sharedOpts, mainRan = opts, true
	code := m.Run()
	if shared != nil {
		if code != 0 {
			fmt.Fprintln(os.Stderr, shared.Logs())
		}
		shared.Stop()
	}
	return code
}

// Shared returns the package's server, started on the first call; see Main for
// when it skips.
func Shared(t testing.TB) *Server {
	t.Helper()
	sharedOnce.Do(func() {
		if !mainRan { // nothing would stop a server started here
			sharedErr = errors.New("kubetest: Shared needs kubetest.Main in the package's TestMain")
			return
		}
		shared, sharedErr = Start(sharedOpts)
		if sharedErr != nil {
			fmt.Fprintln(os.Stderr, "kubetest:", sharedErr)
		}
	})
	if shared != nil {
		return shared
	}
	skipOrFail(t, sharedErr)
	return nil
}

// StartT starts a server for one test and stops it on t.Cleanup.
func StartT(t testing.TB, opts Options) *Server {
	t.Helper()
	s, err := Start(opts)
	if err != nil {
		skipOrFail(t, err)
		return nil
	}
	t.Cleanup(s.Stop)
	return s
}

func skipOrFail(t testing.TB, err error) {
	t.Helper()
	if err == nil {
		err = errSkipped
	}
	if errors.Is(err, ErrNoBinaries) && os.Getenv("CI") != "true" {
		t.Skip(err)
	}
	t.Fatal(err)
}

// Namespace creates a fresh namespace named after the test and deletes it on
// cleanup (the namespace controller does not run, so its objects stay in
// etcd until the server stops; names never repeat).
func (s *Server) Namespace(t testing.TB) string {
	t.Helper()
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		t.Fatal(err)
	}
	name := strings.ToLower(t.Name())
	name = strings.Map(func(r rune) rune {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			return r
		}
		return '-'
	}, name)
	if len(name) > 40 {
		name = name[:40]
	}
	name = fmt.Sprintf("%s-%d", strings.Trim(name, "-"), nsSeq.Add(1))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatalf("create namespace: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = cs.CoreV1().Namespaces().Delete(ctx, name, metav1.DeleteOptions{})
	})
	return name
}
