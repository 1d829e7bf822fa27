package gossip

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net"
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
		{"0.0.0.0:0", "10.0.0.5", Config{BindAddr: "0.0.0.0", AdvertiseAddr: "10.0.0.5"}, ""},
		// The pod IP alone reads the same on IPv4 and IPv6 clusters.
		{"0.0.0.0:7946", "fd00::1", Config{BindAddr: "0.0.0.0", BindPort: 7946, AdvertiseAddr: "fd00::1"}, ""},
		{"[::]:7946", "[fd00::1]:7947", Config{BindAddr: "::", BindPort: 7946, AdvertiseAddr: "fd00::1", AdvertisePort: 7947}, ""},
		// In brackets without a port, as --engine-host takes it: the bind port.
		{"[::]:7946", "[fd00::1]", Config{BindAddr: "::", BindPort: 7946, AdvertiseAddr: "fd00::1"}, ""},
		{"[::]:7946", "[pod]", Config{}, `"pod" is not an IP address`},
		// Never split at the last colon: this is an IPv6 address.
		{":7946", "fd00::1:7946", Config{BindPort: 7946, AdvertiseAddr: "fd00::1:7946"}, ""},
		// Memberlist dials and binds IPs: a name fails here, before NATS.
		{"0.0.0.0:0", "pod.example", Config{}, `gossip advertise "pod.example" (--gossip-advertise): "pod.example" is not an IP address`},
		{"0.0.0.0:0", "pod.example:7946", Config{}, `"pod.example" is not an IP address`},
		{"0.0.0.0:0", "fd00::1:7946:x", Config{}, `is not an IP address`},
		{"localhost:7946", "", Config{}, `gossip bind "localhost:7946" (--gossip-bind): "localhost" is not an IP address`},
		{"fd00::1:7946", "", Config{}, `gossip bind "fd00::1:7946": want host:port`},
		{"[::1]:7946", "10.0.0.1:8000", Config{BindAddr: "::1", BindPort: 7946, AdvertiseAddr: "10.0.0.1", AdvertisePort: 8000}, ""},
		{"nope", "", Config{}, `gossip bind "nope": want host:port`},
		{"h:99999", "", Config{}, `gossip bind "h:99999"`},
		{"127.0.0.1:1", ":x", Config{BindAddr: "127.0.0.1", BindPort: 1}, `gossip advertise ":x" (--gossip-advertise): want IP or IP:port`},
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

// TestUnspecifiedAdvertiseRefused: a member that would advertise an address
// no peer can dial is refused at start, saying to give --gossip-advertise:
// bound to [::] (or an empty host) without one, memberlist advertises ::,
// and peers that dial it dial themselves (tester h-ipv6 U2). Bound to
// 0.0.0.0 memberlist picks a private address of the host's itself.
func TestUnspecifiedAdvertiseRefused(t *testing.T) {
	for _, tc := range []struct {
		bind, adv string
		refused   bool
	}{
		{"[::]:7946", "", true},
		{":7946", "", true},
		{"[::]:7946", "::", true},
		{"0.0.0.0:7946", "0.0.0.0", true},
		{"10.0.0.5:7946", "[::]:7947", true},
		{"[::]:7946", "fd00::1", false},
		{":7946", "10.0.0.5", false},
		{"0.0.0.0:7946", "", false},
		{"[::1]:7946", "", false},
		{"127.0.0.1:0", "", false},
	} {
		c := testConfig("n", RoleSidecar, nil)
		if err := c.SetAddrs(tc.bind, tc.adv); err != nil {
			t.Fatalf("%s %s: %v", tc.bind, tc.adv, err)
		}
		err := c.Validate()
		if refused := err != nil; refused != tc.refused || refused && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "--gossip-advertise")) {
			t.Errorf("bind %s advertise %q: %v, want refused %v naming --gossip-advertise", tc.bind, tc.adv, err, tc.refused)
		}
	}
	c := testConfig("n", RoleSidecar, nil)
	c.BindAddr = "::"
	if _, err := New(c); !errors.Is(err, ErrConfig) {
		t.Errorf("New bound to :: without an advertise address: %v, want refused", err)
	}
}

// TestBindErrorBracketsIPv6: a gossip port that cannot be bound is named
// as host:port with an IPv6 address in brackets, [::1]:P, not ::1:P
// (tester h-ipv6 F6).
func TestBindErrorBracketsIPv6(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback: %v", err)
	}
	defer ln.Close()
	c := testConfig("n", RoleSidecar, nil)
	port := ln.Addr().(*net.TCPAddr).Port
	if err := c.SetAddrs(fmt.Sprintf("[::1]:%d", port), ""); err != nil {
		t.Fatal(err)
	}
	_, err = New(c)
	if want := fmt.Sprintf("bind [::1]:%d: ", port); err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("New on a taken port: %v, want %q", err, want)
	}
}
