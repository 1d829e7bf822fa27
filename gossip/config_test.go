package gossip

import "testing"

// Gossip without a key warns unless bound to loopback (an empty key from
// an empty Secret value turned encryption off without a word).
func TestUnencryptedWarning(t *testing.T) {
	for _, tc := range []struct {
		bind string
		key  []byte
		warn bool
	}{
		{"0.0.0.0", nil, true}, {"10.0.0.7", nil, true}, {"::", nil, true}, {"", nil, true},
		{"127.0.0.1", nil, false}, {"::1", nil, false}, {"0.0.0.0", make([]byte, 16), false},
	} {
		if got := unencryptedWarning(Config{BindAddr: tc.bind, SecretKey: tc.key}) != ""; got != tc.warn {
			t.Errorf("bind %q, key of %d bytes: warns %v, want %v", tc.bind, len(tc.key), got, tc.warn)
		}
	}
}
