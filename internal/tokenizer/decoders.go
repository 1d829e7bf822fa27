package tokenizer

import (
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns token spellings back into text (tokenizers' decode_chain
// followed by a join).
type decoder interface {
	chain(tokens []string) []string
}

type decoderFunc func(tokens []string) []string

func (f decoderFunc) chain(tokens []string) []string { return f(tokens) }

func decodeTokens(d decoder, tokens []string) string {
	if d != nil {
		tokens = d.chain(tokens)
	}
	return strings.Join(tokens, "")
}

// byteLevelDecoder maps byte-level runes back to bytes. raw: the model
// vocabulary is already raw bytes, so tokens pass unchanged.
func byteLevelDecoder(raw bool) decoder {
	return decoderFunc(func(tokens []string) []string {
		if raw {
			return tokens
		}
		for i, t := range tokens {
			tokens[i] = byteLevelDecodeToken(t)
		}
		return tokens
	})
}

func wordPieceDecoder(prefix string, cleanup bool) decoder {
	return decoderFunc(func(tokens []string) []string {
		for i, t := range tokens {
			if i != 0 {
				if strings.HasPrefix(t, prefix) {
					t = strings.Replace(t, prefix, "", 1)
				} else {
					t = " " + t
				}
			}
			if cleanup {
				t = cleanupSpaces(t)
			}
			tokens[i] = t
		}
		return tokens
	})
}

var cleanupReplacer = []string{" .", ".", " ?", "?", " !", "!", " ,", ",", " ' ", "'", " n't", "n't",
	" 'm", "'m", " do not", " don't", " 's", "'s", " 've", "'ve", " 're", "'re"}

// cleanupSpaces is tokenizers' clean_up_tokenization, applied in its order.
func cleanupSpaces(s string) string {
	for i := 0; i < len(cleanupReplacer); i += 2 {
		s = strings.ReplaceAll(s, cleanupReplacer[i], cleanupReplacer[i+1])
	}
	return s
}

func metaspaceDecoder(replacement string, stripFirst bool) decoder {
	return decoderFunc(func(tokens []string) []string {
		for i, t := range tokens {
			// tokenizers drops every replacement in the first token
			// (not only a leading one) and keeps its literal spaces.
			if i == 0 && stripFirst {
				tokens[i] = strings.ReplaceAll(t, replacement, "")
			} else {
				tokens[i] = strings.ReplaceAll(t, replacement, " ")
			}
		}
		return tokens
	})
}

// byteFallbackDecoder turns runs of <0xXX> tokens into the bytes they spell;
// an invalid byte run becomes one U+FFFD per byte, as in tokenizers.
func byteFallbackDecoder() decoder {
	return decoderFunc(func(tokens []string) []string {
		out := tokens[:0:0]
		var pending []byte
		flush := func() {
			if len(pending) == 0 {
				return
			}
			if utf8.Valid(pending) {
				out = append(out, string(pending))
			} else {
				for range pending {
					out = append(out, "\uFFFD")
				}
			}
			pending = pending[:0]
		}
		for _, t := range tokens {
			if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
				if b, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
					pending = append(pending, byte(b))
					continue
				}
			}
			flush()
			out = append(out, t)
		}
		flush()
		return out
	})
}

func fuseDecoder() decoder {
	return decoderFunc(func(tokens []string) []string {
		return []string{strings.Join(tokens, "")}
	})
}

func stripDecoder(content string, start, stop int) decoder {
	return decoderFunc(func(tokens []string) []string {
		for i, t := range tokens {
			for k := 0; k < start && strings.HasPrefix(t, content); k++ {
				t = t[len(content):]
			}
			for k := 0; k < stop && strings.HasSuffix(t, content); k++ {
				t = t[:len(t)-len(content)]
			}
			tokens[i] = t
		}
		return tokens
	})
}

func replaceDecoder(r replacer) decoder {
	return decoderFunc(func(tokens []string) []string {
		for i, t := range tokens {
			tokens[i] = r.replaceAll(t)
		}
		return tokens
	})
}

// bpeDecoder replaces the end-of-word suffix with a space (none after the last token).
func bpeDecoder(suffix string) decoder {
	return decoderFunc(func(tokens []string) []string {
		for i, t := range tokens {
			rep := " "
			if i == len(tokens)-1 {
				rep = ""
			}
			tokens[i] = strings.ReplaceAll(t, suffix, rep)
		}
		return tokens
	})
}

type decoderSequence []decoder

func (q decoderSequence) chain(tokens []string) []string {
	for _, d := range q {
		tokens = d.chain(tokens)
	}
	return tokens
}
