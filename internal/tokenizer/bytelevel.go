package tokenizer

import "strings"

// The GPT-2 byte-level alphabet: every byte maps to one printable rune, so a
// byte-level vocabulary is written in text. At load we convert vocabulary and
// merges back to raw bytes, so encoding never maps runes at run time.
var (
	byteToRune [256]rune
	runeToByte [324]int16 // rune → byte, -1 outside the alphabet (max rune 323)
)

func init() {
	n := 0
	for i := range runeToByte {
		runeToByte[i] = -1
	}
	for b := 0; b < 256; b++ {
		printable := (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF)
		if printable {
			byteToRune[b] = rune(b)
		} else {
			byteToRune[b] = rune(256 + n)
			n++
		}
		runeToByte[byteToRune[b]] = int16(b)
	}
}

// byteLevelDecodeString maps a byte-level spelling to raw bytes; ok is false
// when a rune is outside the alphabet.
func byteLevelDecodeString(s string) (string, bool) {
	buf := make([]byte, 0, len(s))
	for _, r := range s {
		if r < 0 || int(r) >= len(runeToByte) || runeToByte[r] < 0 {
			return "", false
		}
		buf = append(buf, byte(runeToByte[r]))
	}
	return string(buf), true
}

// byteLevelEncodeString maps raw bytes to their byte-level spelling.
func byteLevelEncodeString(s string) string {
	var sb strings.Builder
	sb.Grow(len(s) * 2)
	for i := 0; i < len(s); i++ {
		sb.WriteRune(byteToRune[s[i]])
	}
	return sb.String()
}

// byteLevelDecodeToken is the ByteLevel decoder's rule for one token: runes of
// the alphabet become bytes; a token with any other rune is kept as written.
func byteLevelDecodeToken(s string) string {
	if raw, ok := byteLevelDecodeString(s); ok {
		return raw
	}
	return s
}
