package gossip

import (
	"encoding/base64"
	"strings"
	"testing"
)

func TestSetAddrs(t *testing.T) {
	for _, tc := range []struct {
		bind, adv string
		want      Config
		err       string
	}{
		{"127.0.0.1:7946", "", Config{BindAddr: "127.0.0.1", BindPort: 7946}, ""},
		{"0.0.0.0:0", "pod.example", Config{BindAddr: "0.0.0.0", AdvertiseAddr: "pod.example"}, ""},
		{"[::1]:7946", "10.0.0.1:8000", Config{BindAddr: "::1", BindPort: 7946, AdvertiseAddr: "10.0.0.1", AdvertisePort: 8000}, ""},
		{"nope", "", Config{}, `gossip bind "nope": want host:port`},
		{"h:99999", "", Config{}, `gossip bind "h:99999"`},
		{"h:1", ":x", Config{BindAddr: "h", BindPort: 1}, `gossip advertise ":x": want host or host:port`},
	} {
		var c Config
		err := c.SetAddrs(tc.bind, tc.adv)
		if tc.err == "" && err != nil || tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)) {
			t.Errorf("%q %q: error %v, want %q", tc.bind, tc.adv, err, tc.err)
		}
		if tc.err == "" && (c.BindAddr != tc.want.BindAddr || c.BindPort != tc.want.BindPort ||
			c.AdvertiseAddr != tc.want.AdvertiseAddr || c.AdvertisePort != tc.want.AdvertisePort) {
			t.Errorf("%q %q: %+v, want %+v", tc.bind, tc.adv, c, tc.want)
		}
	}
}

func TestDecodeKey(t *testing.T) {
	for n, ok := range map[int]bool{16: true, 24: true, 32: true, 8: false, 33: false} {
		_, err := DecodeKey(base64.StdEncoding.EncodeToString(make([]byte, n)))
		if (err == nil) != ok {
			t.Errorf("%d bytes: %v", n, err)
		}
	}
	if _, err := DecodeKey("!!"); err == nil {
		t.Error("non-base64 key accepted")
	}
}
