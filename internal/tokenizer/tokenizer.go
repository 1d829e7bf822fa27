package tokenizer

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"unicode/utf8"
)

// Tokenizer turns text into token ids and back, identically to the Hugging Face
// tokenizers library for the same tokenizer.json.
//
// Concurrency: every method is safe for concurrent use by many goroutines; an
// implementation holds no per-call state between calls.
type Tokenizer interface {
	// Encode returns the ids of text. addSpecialTokens applies the
	// post-processor (e.g. Llama 3's <|begin_of_text|>, BERT's [CLS] … [SEP]);
	// special tokens written in the text are always recognised, as in Hugging Face.
	Encode(text string, addSpecialTokens bool) []uint32
	// AppendEncode appends the ids of text to dst and returns the extended slice;
	// with enough capacity in dst it allocates nothing on the hot path.
	AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32
	// Decode turns ids back into text; unknown ids are skipped. Invalid UTF-8
	// (an id sequence cut inside a character) becomes U+FFFD, as in Hugging Face.
	Decode(ids []uint32, skipSpecialTokens bool) string
	// VocabSize is the number of ids including added tokens (max id + 1).
	VocabSize() int
	// TokenToID looks up a token (model vocabulary or added token) by its
	// tokenizer.json spelling.
	TokenToID(token string) (uint32, bool)
	// IDToToken returns the tokenizer.json spelling of id.
	IDToToken(id uint32) (string, bool)
}

// Sentinel errors; match with errors.Is.
var (
	// ErrUnsupported is returned by Load for a tokenizer.json component this
	// package does not implement (the error names the component).
	ErrUnsupported = errors.New("tokenizer: unsupported component")
	// ErrInvalid is returned for malformed tokenizer.json or tokenizer_config.json.
	ErrInvalid = errors.New("tokenizer: invalid file")
)

// Native is the pure-Go implementation of a Hugging Face tokenizer.json:
// added tokens, normalizer, pre-tokenizer, model (BPE, WordPiece, WordLevel,
// Unigram), post-processor and decoder. Its configuration is immutable after
// Load; the only mutable state is the BPE word cache (wordcache.go), which is
// bounded and safe for concurrent use.
type Native struct {
	added      *addedVocab
	normalizer normalizer   // nil: none
	pre        preTokenizer // nil: each piece is one word
	model      model
	post       postProcessor // nil: none
	decoder    decoder       // nil: tokens joined with spaces, as tokenizers does
	// byteLevel: the model vocabulary was converted from the byte-level
	// alphabet to raw bytes at load, so words are fed to the model as raw bytes.
	byteLevel bool
	// decodeSpelled: byteLevel without a ByteLevel decoder step, so Decode
	// gives the model's tokens spelled in the byte-level alphabet, as
	// tokenizers does ("Ġworld"), not raw bytes.
	decodeSpelled bool
	// prefixSafe: encoding text[:b] and text[b:] separately gives the ids of
	// text at every boundary b chosen by cutPoint (see cache.go).
	prefixSafe bool
	vocabSize  int
	scratch    sync.Pool // *scratch
}

var _ Tokenizer = (*Native)(nil)

// scratch is the per-call working memory, pooled so a warm Encode allocates nothing.
type scratch struct {
	words  []string
	words2 []string
	bpe    bpeScratch
	pieces []piece
	spans  []span
}

func (t *Native) getScratch() *scratch {
	if s, ok := t.scratch.Get().(*scratch); ok {
		return s
	}
	return &scratch{}
}

// LoadFile reads and parses a tokenizer.json file.
func LoadFile(path string) (*Native, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	return Load(b)
}

// Encode implements Tokenizer.
func (t *Native) Encode(text string, addSpecialTokens bool) []uint32 {
	return t.AppendEncode(make([]uint32, 0, len(text)/3+4), text, addSpecialTokens)
}

// AppendEncode implements Tokenizer.
func (t *Native) AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	start := len(dst)
	dst = t.appendRaw(dst, text, true)
	if addSpecialTokens && t.post != nil {
		dst = t.post.apply(dst, start)
	}
	return dst
}

// AppendEncodeBounded is AppendEncode within b: when b stops the encoding
// it returns dst as it came and the reason (ErrTooManyTokens, ErrDeadline,
// or the error of b.Stop).
func (t *Native) AppendEncodeBounded(dst []uint32, text string, addSpecialTokens bool, b Bound) ([]uint32, error) {
	start := len(dst)
	dst, err := t.appendRawBound(dst, text, true, &b, start)
	if err != nil {
		return dst[:start], err
	}
	if addSpecialTokens && t.post != nil {
		dst = t.post.apply(dst, start)
	}
	return dst, nil
}

// appendRaw encodes text without the post-processor. atStart tells whether
// text begins the input (it matters to prepend-style pre-tokenizers).
func (t *Native) appendRaw(dst []uint32, text string, atStart bool) []uint32 {
	dst, _ = t.appendRawBound(dst, text, atStart, nil, 0)
	return dst
}

// appendRawBound is appendRaw within b (nil: none), whose token count
// started at dst[start]. When b stops it, dst holds a partial encoding.
func (t *Native) appendRawBound(dst []uint32, text string, atStart bool, b *Bound, start int) ([]uint32, error) {
	sc := t.getScratch()
	sc.bpe.bound = newBound(b, start)
	sc.pieces = t.added.split(sc.pieces[:0], text)
	for _, p := range sc.pieces {
		if p.id >= 0 {
			dst = append(dst, uint32(p.id))
			continue
		}
		s := text[p.start:p.end]
		if t.normalizer != nil {
			s = t.normalizer.normalize(s)
			if t.added.hasNormalized {
				dst = t.encodeNormalized(dst, sc, s, atStart && p.start == 0)
			} else {
				dst = t.encodeWords(dst, sc, s, atStart && p.start == 0)
			}
		} else {
			dst = t.encodeWords(dst, sc, s, atStart && p.start == 0)
		}
		if sc.bpe.bound.err != nil {
			break
		}
	}
	err := sc.bpe.bound.err
	sc.bpe.bound = bound{}
	sc.trim()
	t.scratch.Put(sc)
	return dst, err
}

// trim drops buffers too large to keep in the pool (keep): one huge prompt
// must not pin its scratch, nor views of its text, after it is done.
func (sc *scratch) trim() {
	sc.words, sc.words2 = keep(sc.words), keep(sc.words2)
	sc.pieces, sc.spans = keep(sc.pieces), keep(sc.spans)
}

// encodeNormalized splits a normalized piece on the added tokens that match
// normalized text, then encodes the rest.
func (t *Native) encodeNormalized(dst []uint32, sc *scratch, s string, atStart bool) []uint32 {
	var ps []piece
	ps = t.added.splitNormalized(ps, s)
	for _, p := range ps {
		if p.id >= 0 {
			dst = append(dst, uint32(p.id))
			continue
		}
		dst = t.encodeWords(dst, sc, s[p.start:p.end], atStart && p.start == 0)
		if sc.bpe.bound.err != nil {
			break
		}
	}
	return dst
}

func (t *Native) encodeWords(dst []uint32, sc *scratch, s string, atStart bool) []uint32 {
	if s == "" {
		return dst
	}
	words := append(sc.words[:0], s)
	if t.pre != nil {
		words = t.pre.split(words, sc, atStart)
	}
	bd := &sc.bpe.bound
	for _, w := range words {
		if w != "" {
			dst = t.model.tokenize(dst, w, &sc.bpe)
			if bd.on && bd.after(len(dst), len(w)) {
				break
			}
		}
	}
	sc.words = words[:0]
	return dst
}

// Decode implements Tokenizer.
func (t *Native) Decode(ids []uint32, skipSpecialTokens bool) string {
	toks := make([]string, 0, len(ids))
	for _, id := range ids {
		if a, ok := t.added.byID[id]; ok {
			if skipSpecialTokens && a.special {
				continue
			}
			toks = append(toks, a.decodeForm)
			continue
		}
		if tok, ok := t.model.idToToken(id); ok {
			if t.decodeSpelled {
				tok = byteLevelEncodeString(tok)
			}
			toks = append(toks, tok)
		}
	}
	var s string
	if t.decoder != nil {
		s = decodeTokens(t.decoder, toks)
	} else {
		s = strings.Join(toks, " ")
	}
	if !utf8.ValidString(s) {
		s = strings.ToValidUTF8(s, "\uFFFD")
	}
	return s
}

// VocabSize implements Tokenizer.
func (t *Native) VocabSize() int { return t.vocabSize }

// TokenToID implements Tokenizer.
func (t *Native) TokenToID(token string) (uint32, bool) {
	if id, ok := t.added.byContent[token]; ok {
		return id, true
	}
	if t.byteLevel {
		raw, ok := byteLevelDecodeString(token)
		if !ok {
			return 0, false
		}
		token = raw
	}
	return t.model.tokenToID(token)
}

// IDToToken implements Tokenizer.
func (t *Native) IDToToken(id uint32) (string, bool) {
	if a, ok := t.added.byID[id]; ok {
		return a.content, true
	}
	tok, ok := t.model.idToToken(id)
	if ok && t.byteLevel {
		tok = byteLevelEncodeString(tok)
	}
	return tok, ok
}

// IsSpecial reports whether id is an added token flagged special.
func (t *Native) IsSpecial(id uint32) bool {
	a, ok := t.added.byID[id]
	return ok && a.special
}
