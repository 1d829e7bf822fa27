package ingress

import (
	"strconv"
	"unicode/utf8"
)

// maxEcho bounds a client-chosen string (a model name, a session id, a
// path) where the ingress writes it back: in the access log and in error
// messages. A request body may be 32 MiB and a head 16 KiB; a log line or
// an error is not the place to copy them.
const maxEcho = 256

// clip returns s, or its first maxEcho bytes (cut at a character boundary)
// and "…(N bytes)" when it is longer. A short s is returned as it is, with
// no allocation.
func clip(s string) string {
	if len(s) <= maxEcho {
		return s
	}
	return s[:echoCut(s[:maxEcho+1])] + "…(" + strconv.Itoa(len(s)) + " bytes)"
}

// clipBytes is clip for a byte slice (a header's or the path's bytes).
func clipBytes(b []byte) string {
	if len(b) <= maxEcho {
		return string(b)
	}
	return string(b[:echoCut(string(b[:maxEcho+1]))]) + "…(" + strconv.Itoa(len(b)) + " bytes)"
}

// echoCut is where to cut p (maxEcho+1 bytes of a longer string): at most
// maxEcho bytes, not inside a character.
func echoCut(p string) int {
	cut := maxEcho
	for cut > 0 && !utf8.RuneStart(p[cut]) {
		cut--
	}
	return cut
}
