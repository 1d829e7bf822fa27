package gossip

import (
	"net/url"
	"strings"
	"testing"
)

// FuzzNormalURL: the normal form of a gossiped engine URL is stable
// (normalizing it again changes nothing but a trailing slash), ignores the case of scheme and
// host and the scheme's default port, and a parsable URL keeps its scheme,
// port and path.
func FuzzNormalURL(f *testing.F) {
	for _, s := range []string{
		"http://10.0.0.1:8000", "HTTP://Engine-A.default.svc:8000/", "http://10.0.0.1:80/v1/", "https://[::ffff:10.0.0.1]:443",
		"http://[fe80::1%25eth0]:8000", "http://[2001:DB8::1]:8000/x", " http://a:1/ ", "engine-a:8000", "", "/", "http://",
		"http://user:pw@h:9/p?q=1#f", "http://h:8000/%2F/", "http://[::1]", "http://0x7f.1:8000", "http://%41:8000",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		n := NormalURL(raw)
		u, err := url.Parse(strings.TrimSpace(raw))
		if err != nil || u.Host == "" {
			// Unparsable: compared as gossiped, less a trailing slash.
			if want := strings.TrimSuffix(strings.TrimSpace(raw), "/"); n != want {
				t.Fatalf("NormalURL(%q) = %q, want %q", raw, n, want)
			}
			return
		}
		// Stable up to trailing slashes: one is dropped per pass ("/a//" is
		// "/a/", then "/a"); callers normalize each URL once.
		if again := NormalURL(n); strings.TrimRight(again, "/") != strings.TrimRight(n, "/") {
			t.Fatalf("NormalURL(%q) = %q, but NormalURL(%q) = %q", raw, n, n, again)
		}
		tr := strings.TrimSpace(raw)
		if up := NormalURL(strings.ToUpper(tr[:len(u.Scheme)]) + tr[len(u.Scheme):]); up != n {
			t.Fatalf("scheme case matters: %q vs %q", up, n)
		}
		if !strings.HasPrefix(n, strings.ToLower(u.Scheme)+"://") {
			t.Fatalf("NormalURL(%q) = %q lost the scheme", raw, n)
		}
		if p := u.Port(); p != "" && !(p == "80" && strings.EqualFold(u.Scheme, "http")) && !(p == "443" && strings.EqualFold(u.Scheme, "https")) {
			if !strings.Contains(n, ":"+p) {
				t.Fatalf("NormalURL(%q) = %q lost the port %s", raw, n, p)
			}
		}
	})
}
