package kubetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// Options configure one API server.
type Options struct {
	// RBAC selects --authorization-mode=RBAC; the default is AlwaysAllow.
	// The admin token is in system:masters either way.
	RBAC bool
	// StartTimeout bounds the wait for etcd and /readyz (default 3 min: a
	// busy 2-core machine takes 10–60 s).
	StartTimeout time.Duration
	// ExtraArgs are appended to kube-apiserver's flags.
	ExtraArgs []string
}

// Server is a running etcd + kube-apiserver pair.
type Server struct {
	// Config is an admin (system:masters) client config.
	Config *rest.Config
	// Kubeconfig is a kubeconfig file for the same admin identity.
	Kubeconfig string
	// URL is the API server's https URL.
	URL string
	// CAPEM is the CA that signed the API server's serving certificate.
	CAPEM []byte
	// Dir is the temporary directory holding data, certificates and logs.
	Dir string

	procs    []*exec.Cmd
	logs     []string
	stopOnce sync.Once
}

// Start starts etcd and kube-apiserver from BinDir and waits until the API
// server is ready. The caller must call Stop.
func Start(opts Options) (*Server, error) {
	bin, err := BinDir()
	if err != nil {
		return nil, err
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = 3 * time.Minute
	}
	dir, err := os.MkdirTemp("", "kvmesh-kubetest-")
	if err != nil {
		return nil, err
	}
	s := &Server{Dir: dir}
	ctx, cancel := context.WithTimeout(context.Background(), opts.StartTimeout)
	defer cancel()
	if err := s.start(ctx, bin, opts); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

func (s *Server) start(ctx context.Context, bin string, opts Options) error {
	etcdURL, err := s.startEtcd(ctx, bin)
	if err != nil {
		return err
	}
	return s.startAPIServer(ctx, bin, etcdURL, opts)
}

func (s *Server) startEtcd(ctx context.Context, bin string) (string, error) {
	ports, err := freePorts(2)
	if err != nil {
		return "", err
	}
	client := "http://127.0.0.1:" + strconv.Itoa(ports[0])
	peer := "http://127.0.0.1:" + strconv.Itoa(ports[1])
	args := []string{
		"--name=kubetest", "--data-dir=" + filepath.Join(s.Dir, "etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=kubetest=" + peer, "--log-level=warn", "--unsafe-no-fsync=true",
	}
	if err := s.spawn(filepath.Join(bin, "etcd"), args, "etcd.log"); err != nil {
		return "", err
	}
	err = s.poll(ctx, "etcd", func() bool {
		resp, err := http.Get(client + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return client, err
}

func (s *Server) startAPIServer(ctx context.Context, bin, etcdURL string, opts Options) error {
	ca, err := NewCA("kvmesh-kubetest-ca")
	if err != nil {
		return err
	}
	certPEM, keyPEM, err := ca.Serving("kube-apiserver", []net.IP{net.IPv4(127, 0, 0, 1), net.IPv4(10, 0, 0, 1)},
		[]string{"localhost", "kubernetes", "kubernetes.default", "kubernetes.default.svc"})
	if err != nil {
		return err
	}
	token := randomToken()
	files := map[string][]byte{
		"ca.crt": ca.CertPEM, "apiserver.crt": certPEM, "apiserver.key": keyPEM,
		"tokens.csv": []byte(token + ",kubetest-admin,kubetest-admin,\"system:masters\"\n"),
	}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(s.Dir, name), b, 0o600); err != nil {
			return err
		}
	}
	saKey, saPub := filepath.Join(s.Dir, "sa.key"), filepath.Join(s.Dir, "sa.pub")
	if err := writeKeyPair(saKey, saPub); err != nil {
		return err
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	authz := "AlwaysAllow"
	if opts.RBAC {
		authz = "RBAC"
	}
	args := []string{
		"--etcd-servers=" + etcdURL,
		"--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", "--secure-port=" + strconv.Itoa(ports[0]),
		"--tls-cert-file=" + filepath.Join(s.Dir, "apiserver.crt"), "--tls-private-key-file=" + filepath.Join(s.Dir, "apiserver.key"),
		"--cert-dir=" + filepath.Join(s.Dir, "certs"),
		"--token-auth-file=" + filepath.Join(s.Dir, "tokens.csv"),
		"--authorization-mode=" + authz,
		"--service-account-issuer=https://kubernetes.default.svc.cluster.local",
		"--service-account-key-file=" + saPub, "--service-account-signing-key-file=" + saKey,
		"--service-cluster-ip-range=10.0.0.0/24",
		"--endpoint-reconciler-type=none",
		// No token controller runs, so pods must not need a "default" ServiceAccount.
		"--disable-admission-plugins=ServiceAccount",
		"--enable-priority-and-fairness=false", "--profiling=false",
		"--v=1",
	}
	args = append(args, opts.ExtraArgs...)
	if err := s.spawn(filepath.Join(bin, "kube-apiserver"), args, "kube-apiserver.log"); err != nil {
		return err
	}
	s.URL = "https://127.0.0.1:" + strconv.Itoa(ports[0])
	s.CAPEM = ca.CertPEM
	s.Config = &rest.Config{
		Host:            s.URL,
		BearerToken:     token,
		TLSClientConfig: rest.TLSClientConfig{CAData: ca.CertPEM},
		QPS:             200, Burst: 400,
	}
	if err := s.writeKubeconfig(token); err != nil {
		return err
	}
	cs, err := kubernetes.NewForConfig(s.Config)
	if err != nil {
		return err
	}
	return s.poll(ctx, "kube-apiserver /readyz", func() bool {
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		body, err := cs.Discovery().RESTClient().Get().AbsPath("/readyz").DoRaw(pctx)
		return err == nil && strings.TrimSpace(string(body)) == "ok"
	})
}

func (s *Server) writeKubeconfig(token string) error {
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["kubetest"] = &clientcmdapi.Cluster{Server: s.URL, CertificateAuthorityData: s.CAPEM}
	cfg.AuthInfos["admin"] = &clientcmdapi.AuthInfo{Token: token}
	cfg.Contexts["kubetest"] = &clientcmdapi.Context{Cluster: "kubetest", AuthInfo: "admin", Namespace: "default"}
	cfg.CurrentContext = "kubetest"
	s.Kubeconfig = filepath.Join(s.Dir, "kubeconfig")
	return clientcmd.WriteToFile(*cfg, s.Kubeconfig)
}

// spawn starts a child whose output goes to a log file in Dir and who is
// killed if this process dies first.
func (s *Server) spawn(path string, args []string, logName string) error {
	logPath := filepath.Join(s.Dir, logName)
	f, err := os.Create(logPath)
	if err != nil {
		return err
	}
	cmd := exec.Command(path, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Dir = s.Dir
	cmd.Env = loopbackEnv()
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		f.Close()
		return fmt.Errorf("start %s: %w", filepath.Base(path), err)
	}
	f.Close() // the child holds its own descriptor
	s.procs = append(s.procs, cmd)
	s.logs = append(s.logs, logPath)
	return nil
}

// loopbackEnv is the environment without proxy settings: the API server
// must reach webhooks on 127.0.0.1 directly.
func loopbackEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if strings.EqualFold(k, "http_proxy") || strings.EqualFold(k, "https_proxy") || strings.EqualFold(k, "no_proxy") {
			continue
		}
		env = append(env, kv)
	}
	return append(env, "NO_PROXY=127.0.0.1,localhost")
}

// poll waits for ready, failing early when a child has exited.
func (s *Server) poll(ctx context.Context, what string, ready func() bool) error {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for {
		if ready() {
			return nil
		}
		for i, p := range s.procs {
			if p.ProcessState != nil || processGone(p) {
				return fmt.Errorf("%s exited while waiting for %s:\n%s", filepath.Base(p.Path), what, tail(s.logs[i]))
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w\n%s", what, ctx.Err(), tail(s.logs[len(s.logs)-1]))
		case <-t.C:
		}
	}
}

func processGone(p *exec.Cmd) bool {
	var ws syscall.WaitStatus
	pid, err := syscall.Wait4(p.Process.Pid, &ws, syscall.WNOHANG, nil)
	return err == nil && pid == p.Process.Pid
}

// Logs returns the tail of both processes' logs, for a failing test.
func (s *Server) Logs() string {
	var b strings.Builder
	for _, l := range s.logs {
		b.WriteString("== " + filepath.Base(l) + "\n" + tail(l))
	}
	return b.String()
}

func tail(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	if len(b) > 6000 {
		b = b[len(b)-6000:]
	}
	return string(b)
}

// Stop terminates the API server, then etcd (SIGTERM, SIGKILL after 15 s),
// and removes Dir. Safe to call more than once.
func (s *Server) Stop() {
	s.stopOnce.Do(func() {
		for i := len(s.procs) - 1; i >= 0; i-- {
			stopProcess(s.procs[i])
		}
		if os.Getenv("KVMESH_KUBETEST_KEEP") == "" {
			os.RemoveAll(s.Dir)
		}
	})
}

func stopProcess(cmd *exec.Cmd) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		cmd.Wait() //nolint:errcheck // exit status of a stopped child is not interesting
	}()
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// freePorts reserves n distinct loopback ports by listening on :0 and
// closing; the small race with other processes is accepted (start-up fails
// loudly if a port was taken).
func freePorts(n int) ([]int, error) {
	var ls []net.Listener
	defer func() {
		for _, l := range ls {
			l.Close()
		}
	}()
	var ports []int
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		ls = append(ls, l)
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

func randomToken() string {
	b := make([]byte, 16)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// errSkipped carries why the shared server is unavailable.
var errSkipped = errors.New("kubetest: no API server")
