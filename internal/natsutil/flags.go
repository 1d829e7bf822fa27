package natsutil

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"strings"

	"github.com/kvmesh/kvmesh/internal/secretflag"
)

// Redacted replaces secrets in anything shown to people.
const Redacted = "redacted"

// BindFlags registers the NATS flags every kvmesh command shares: --nats
// (comma-separated URLs, appended to urls), credentials (--nats-user,
// --nats-password, --nats-token, --nats-nkey, --nats-creds), TLS
// (--nats-ca, --nats-cert, --nats-key, --nats-tls-insecure) and the dead-path
// check (--nats-ping-interval, --nats-max-pings-outstanding), and the
// installation's subject prefix (--nats-prefix, default $KVMESH_NATS_PREFIX:
// Auth.Prefix). The password and
// token default to $KVMESH_NATS_PASSWORD and $KVMESH_NATS_TOKEN so they stay
// out of process listings; help never shows them (secretflag).
func BindFlags(fs *flag.FlagSet, urls *[]string, a *Auth, urlHelp string) {
	fs.Var(&urlList{l: urls}, "nats", urlHelp)
	fs.StringVar(&a.User, "nats-user", a.User, "NATS user")
	secretflag.Var(fs, &a.Password, "nats-password", "KVMESH_NATS_PASSWORD", "NATS `password`")
	secretflag.Var(fs, &a.Token, "nats-token", "KVMESH_NATS_TOKEN", "NATS `token`")
	fs.StringVar(&a.NKeySeedFile, "nats-nkey", a.NKeySeedFile, "NATS nkey seed file")
	fs.StringVar(&a.CredsFile, "nats-creds", a.CredsFile, "NATS credentials (JWT) file")
	fs.StringVar(&a.TLSCAFile, "nats-ca", a.TLSCAFile, "CA file to verify NATS servers")
	fs.StringVar(&a.TLSCertFile, "nats-cert", a.TLSCertFile, "client certificate for NATS (mutual TLS)")
	fs.StringVar(&a.TLSKeyFile, "nats-key", a.TLSKeyFile, "client key for NATS (mutual TLS)")
	fs.BoolVar(&a.TLSInsecureSkipVerify, "nats-tls-insecure", a.TLSInsecureSkipVerify, "do not verify NATS server certificates (test clusters only)")
	fs.DurationVar(&a.PingInterval, "nats-ping-interval", a.PingInterval,
		fmt.Sprintf("ping NATS this often to find a dead path (0: %v)", DefaultPingInterval))
	fs.IntVar(&a.MaxPingsOutstanding, "nats-max-pings-outstanding", a.MaxPingsOutstanding,
		fmt.Sprintf("unanswered pings after which the NATS connection is stale and redialed (0: %d)", DefaultMaxPingsOutstanding))
	if p := os.Getenv("KVMESH_NATS_PREFIX"); p != "" {
		// Over a config file's prefix, as kvmesh's other settings from the
		// environment are (a Secret or ConfigMap env set per installation
		// wins over a YAML shared between them); the flag over both.
		a.Prefix = p
	}
	fs.StringVar(&a.Prefix, "nats-prefix", a.Prefix,
		"`prefix` of every NATS subject and of the stream name, the same for every process of one installation; give each installation sharing a NATS its own (default $KVMESH_NATS_PREFIX, else "+DefaultPrefix+")")
}

// urlList is a comma-separated list flag: its first use replaces the
// default (or a config file's list), a repeat adds to it ("--nats a --nats
// b" is both servers, not the last alone).
type urlList struct {
	l     *[]string
	given bool
}

func (u *urlList) String() string {
	if u == nil || u.l == nil {
		return ""
	}
	return strings.Join(RedactURLs(*u.l), ",")
}

func (u *urlList) Set(s string) error {
	if !u.given {
		*u.l, u.given = nil, true
	}
	for _, v := range strings.Split(s, ",") {
		if v = strings.TrimSpace(v); v != "" {
			*u.l = append(*u.l, v)
		}
	}
	return nil
}

// RedactURL replaces a URL's user information (nats://user:pass@host) with
// "redacted"; strings that do not parse as URLs with userinfo are returned
// unchanged.
func RedactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		if i := strings.LastIndexByte(s, '@'); i >= 0 {
			if j := strings.Index(s, "://"); j >= 0 && j < i {
				return s[:j+3] + Redacted + s[i:]
			}
		}
		return s
	}
	if u.User == nil {
		return s
	}
	u.User = url.User(Redacted)
	return u.String()
}

// RedactURLs redacts every URL of a list into a new slice.
func RedactURLs(l []string) []string {
	if l == nil {
		return nil
	}
	out := make([]string, len(l))
	for i, u := range l {
		out[i] = RedactURL(u)
	}
	return out
}
