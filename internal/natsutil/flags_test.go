package natsutil

import (
	"flag"
	"io"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestBindFlagsSetsEveryField(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cfg := DefaultConfig()
	cfg.URLs = []string{"nats://default:4222"}
	BindFlags(fs, &cfg.URLs, &cfg.Auth, "urls")
	err := fs.Parse([]string{"--nats", "nats://a:1, nats://b:2", "--nats-user", "u", "--nats-password", "p",
		"--nats-ca", "ca.pem", "--nats-cert", "c.pem", "--nats-key", "k.pem", "--nats-tls-insecure",
		"--nats-ping-interval", "3s", "--nats-max-pings-outstanding", "4"})
	if err != nil {
		t.Fatal(err)
	}
	want := Auth{User: "u", Password: "p", TLSCAFile: "ca.pem", TLSCertFile: "c.pem", TLSKeyFile: "k.pem", TLSInsecureSkipVerify: true,
		PingInterval: 3 * time.Second, MaxPingsOutstanding: 4}
	if cfg.Auth != want || !slices.Equal(cfg.URLs, []string{"nats://a:1", "nats://b:2"}) {
		t.Fatalf("auth %+v urls %q", cfg.Auth, cfg.URLs)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if r := cfg.Auth.Redacted(); r.Password != Redacted || r.User != "u" {
		t.Fatalf("redacted %+v", r)
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"nats://user:secret@host:4222": "nats://redacted@host:4222",
		"nats://tok@host:4222":         "nats://redacted@host:4222",
		"nats://host:4222":             "nats://host:4222",
		"tls://u:p%zz@h:1":             "tls://redacted@h:1", // does not parse: still redacted
		"not a url":                    "not a url",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
		if strings.Contains(RedactURL(in), "secret") {
			t.Errorf("secret left in %q", RedactURL(in))
		}
	}
}

func FuzzRedactURL(f *testing.F) {
	for _, s := range []string{"nats://u:p@h:1", "tls://h", "@@://", "nats://a@b@c", "%zz://u:p@h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := RedactURL(s)
		if strings.Contains(s, "://") && strings.Contains(s, ":pw-secret@") && strings.Contains(out, "pw-secret") {
			t.Fatalf("password kept: %q -> %q", s, out)
		}
	})
}

// The password and token default to the environment, a flag replaces
// them, and no help text shows them.
func TestBindFlagsSecretsFromEnvNotShown(t *testing.T) {
	t.Setenv("KVMESH_NATS_PASSWORD", "pw-s3cret")
	t.Setenv("KVMESH_NATS_TOKEN", "tok-s3cret")
	for _, c := range []struct {
		args    []string
		pw, tok string
	}{
		{nil, "pw-s3cret", "tok-s3cret"},
		{[]string{"--nats-password", "other"}, "other", "tok-s3cret"},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var help strings.Builder
		fs.SetOutput(&help)
		var a Auth
		BindFlags(fs, new([]string), &a, "urls")
		if err := fs.Parse(c.args); err != nil || a.Password != c.pw || a.Token != c.tok {
			t.Errorf("%q: %+v, %v", c.args, a, err)
		}
		_ = fs.Parse([]string{"--typo"}) // prints the usage dump
		if strings.Contains(help.String(), "s3cret") || !strings.Contains(help.String(), "(env KVMESH_NATS_PASSWORD; set)") {
			t.Errorf("help shows a secret or not that it is set:\n%s", help.String())
		}
	}
}

// A NATS URL's scheme must be one the client dials; http:// was taken and
// never connected. No error shows a URL's password.
func TestValidateURLScheme(t *testing.T) {
	for u, want := range map[string]string{
		"nats://127.0.0.1:4222":      "",
		"tls://h:4222":               "",
		"ws://h:80":                  "",
		"WSS://h:443":                "",
		"http://127.0.0.1:4222":      `scheme "http"`,
		"http://u:pw-s3cret@h:4222":  `scheme "http"`,
		"127.0.0.1:4222":             "has no scheme",
		"u:pw-s3cret@127.0.0.1:4222": "has no scheme",
		// An IPv6 address without brackets dialed nothing, and the process
		// waited for NATS for ever (tester h-ipv6 F2); each of a list counts.
		"nats://[::1]:4222":                      "",
		"nats://[fe80::1%eth0]:4222":             "",
		"nats://::1:20001":                       "goes in brackets: nats://[::1]:20001",
		"nats://127.0.0.1:4222,nats://::1:20001": "goes in brackets: nats://[::1]:20001",
		"nats://u:pw-s3cret@fd00::5:4222":        "an IPv6 address goes in brackets",
		"tls://2001:db8::1":                      "goes in brackets: tls://[2001:db8::1]:4222",
		"nats://[::1":                            "no closing ]",
		"nats://[nats.example]:4222":             "not an IP address",
		"nats://h:port":                          `port "port" is not a number`,
		"nats://h:70000":                         `port "70000"`,
		"nats://:4222":                           "no host",
		"nats://u:pw-s3cret@/x":                  "no host",
	} {
		c := DefaultConfig()
		c.URLs = []string{u}
		err := c.Validate()
		if want == "" {
			if err != nil {
				t.Errorf("%s: %v", u, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("%s: %v, want %q (no password)", u, err, want)
		}
	}
}

// openServer names the first server off loopback that a connection without
// credentials would use, for Connect's warning; none with credentials, in
// the Auth or in that URL.
func TestOpenServer(t *testing.T) {
	for _, c := range []struct {
		urls []string
		a    Auth
		want string
	}{
		{nil, Auth{}, ""},
		{[]string{"nats://127.0.0.1:4222", "nats://[::1]:4222,nats://localhost:4222"}, Auth{}, ""},
		{[]string{"nats://127.0.0.1:4222", "nats://nats.kvmesh:4222"}, Auth{}, "nats.kvmesh:4222"},
		{[]string{"tls://10.0.0.5:4222"}, Auth{}, "10.0.0.5:4222"},
		{[]string{"nats://u:p@nats.kvmesh:4222"}, Auth{}, ""},
		{[]string{"nats://a:4222,nats://u:p@b:4222"}, Auth{}, "a:4222"},
		{[]string{"nats://nats.kvmesh:4222"}, Auth{User: "sidecar"}, ""},
		{[]string{"nats://nats.kvmesh:4222"}, Auth{Token: "t"}, ""},
		{[]string{"nats://nats.kvmesh:4222"}, Auth{CredsFile: "c"}, ""},
		{[]string{"nats://nats.kvmesh:4222"}, Auth{NKeySeedFile: "k"}, ""},
		{[]string{"tls://nats.kvmesh:4222"}, Auth{TLSCertFile: "c", TLSKeyFile: "k"}, ""},
		{[]string{"tls://nats.kvmesh:4222"}, Auth{TLSCAFile: "ca"}, "nats.kvmesh:4222"},
	} {
		if got := openServer(c.urls, c.a); got != c.want {
			t.Errorf("%v %+v: %q, want %q", c.urls, c.a, got, c.want)
		}
	}
}

// FuzzValidateURL: Validate never panics on a URL, names no password it
// holds, and accepts a host part only in a form that dials: what it accepts
// with a host and port splits into them (an IPv6 address in brackets).
func FuzzValidateURL(f *testing.F) {
	for _, s := range []string{"nats://[::1]:4222", "nats://::1:20001", "nats://u:pw@h:1", "tls://[fe80::1%eth0]:1",
		"nats://a:1,nats://b", "nats://[::1", "ws://h:80/path?q#f", "nats://@", "nats://a@b@c:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, u string) {
		c := DefaultConfig()
		c.URLs = []string{u}
		err := c.Validate()
		if err == nil {
			for _, one := range strings.Split(u, ",") {
				one = strings.TrimSpace(one)
				_, rest, _ := strings.Cut(one, "://")
				if i := strings.IndexAny(rest, "/?#"); i >= 0 {
					rest = rest[:i]
				}
				if i := strings.LastIndexByte(rest, '@'); i >= 0 {
					rest = rest[i+1:]
				}
				if strings.Count(rest, ":") > 1 && !strings.HasPrefix(rest, "[") {
					t.Fatalf("%q accepted with host part %q: an unbracketed IPv6 address", u, rest)
				}
			}
		}
		if err != nil && strings.Contains(u, "@") && strings.Contains(u, ":pw-s3cret@") && strings.Contains(err.Error(), "pw-s3cret") {
			t.Fatalf("the password shown: %v", err)
		}
	})
}

// The prefix's order: the flag, then $KVMESH_NATS_PREFIX, then a config
// file's (the value BindFlags finds), as kvmesh's other settings from the
// environment take precedence over the file.
func TestBindFlagsPrefixOrder(t *testing.T) {
	for _, tc := range []struct {
		env, file string
		args      []string
		want      string
	}{
		{"", "team-f", nil, "team-f"},
		{"team-e", "team-f", nil, "team-e"},
		{"team-e", "", nil, "team-e"},
		{"team-e", "team-f", []string{"--nats-prefix=team-g"}, "team-g"},
	} {
		t.Setenv("KVMESH_NATS_PREFIX", tc.env)
		cfg := DefaultConfig()
		cfg.Prefix = tc.file
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		BindFlags(fs, &cfg.URLs, &cfg.Auth, "urls")
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		if cfg.Prefix != tc.want {
			t.Errorf("env %q, file %q, args %q: prefix %q, want %q", tc.env, tc.file, tc.args, cfg.Prefix, tc.want)
		}
	}
}
