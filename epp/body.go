package epp

import "github.com/kvmesh/kvmesh/internal/jsonscan"

// What the picker reads of a request body's framing: its content-length
// (charged to the body budget, or refused past --max-body, before the body
// comes; and to tell a BUFFERED_PARTIAL body cut at the data plane's
// buffer from a whole one that trailers follow).

// parseContentLength is a content-length header's value, -1 when it is not
// a plain decimal number of at most 15 digits (the data plane validates
// it; an odd one is read as none: the body is then charged as it comes).
func parseContentLength(v string) int {
	if v == "" || len(v) > 15 {
		return -1
	}
	n := 0
	for i := 0; i < len(v); i++ {
		c := v[i]
		if c < '0' || c > '9' {
			return -1
		}
		n = n*10 + int(c-'0')
	}
	return n
}

// jsonComplete reports whether b holds one whole JSON value (whatever
// follows it): false for a body cut short, and for one malformed before
// its end.
func jsonComplete(b []byte) bool {
	_, err := jsonscan.SkipValue(b, jsonscan.SkipWS(b, 0))
	return err == nil
}
