package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// fileJSON is the part of tokenizer.json that affects ids and decoding;
// truncation and padding are batch options the router does not use.
type fileJSON struct {
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	Model         json.RawMessage  `json:"model"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
}

// decodeFile splits tokenizer.json into its parts without a full
// reflection pass over the (large) model.
func decodeFile(data []byte) (*fileJSON, error) {
	raw, err := fields(data)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	f := &fileJSON{Normalizer: raw["normalizer"], PreTokenizer: raw["pre_tokenizer"], Model: raw["model"],
		PostProcessor: raw["post_processor"], Decoder: raw["decoder"]}
	if at := raw["added_tokens"]; !isNull(at) {
		if err := json.Unmarshal(at, &f.AddedTokens); err != nil {
			return nil, fmt.Errorf("added_tokens: %w: %v", ErrInvalid, err)
		}
	}
	return f, nil
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	Lstrip     bool   `json:"lstrip"`
	Rstrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// component is any typed node: {"type": "...", ...}.
type component struct {
	Type string `json:"type"`
	raw  json.RawMessage
}

func parseComponent(raw json.RawMessage) (*component, error) {
	if isNull(raw) {
		return nil, nil
	}
	var c component
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	c.raw = raw
	return &c, nil
}

func (c *component) decode(v any) error {
	if err := json.Unmarshal(c.raw, v); err != nil {
		return fmt.Errorf("%s: %w: %v", c.Type, ErrInvalid, err)
	}
	return nil
}

func isNull(raw json.RawMessage) bool {
	s := bytes.TrimSpace(raw)
	return len(s) == 0 || string(s) == "null"
}

// Load parses the bytes of a tokenizer.json.
func Load(data []byte) (*Native, error) {
	f, err := decodeFile(data)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	t := &Native{}
	if t.normalizer, err = loadNormalizer(f.Normalizer); err != nil {
		return nil, fmt.Errorf("load normalizer: %w", err)
	}
	if t.pre, t.byteLevel, err = loadPreTokenizer(f.PreTokenizer, false); err != nil {
		return nil, fmt.Errorf("load pre_tokenizer: %w", err)
	}
	if t.model, err = loadModel(f.Model, t.byteLevel); err != nil {
		return nil, fmt.Errorf("load model: %w", err)
	}
	byteLevelDec := false
	if t.decoder, byteLevelDec, err = loadDecoder(f.Decoder, t.byteLevel); err != nil {
		return nil, fmt.Errorf("load decoder: %w", err)
	}
	t.decodeSpelled = t.byteLevel && !byteLevelDec
	t.vocabSize = t.model.size()
	var toks []*addedToken
	for _, a := range f.AddedTokens {
		if a.Content == "" {
			return nil, fmt.Errorf("load added_tokens: %w: empty token %d", ErrInvalid, a.ID)
		}
		at := &addedToken{id: a.ID, content: a.Content, special: a.Special, singleWord: a.SingleWord,
			lstrip: a.Lstrip, rstrip: a.Rstrip, normalized: a.Normalized, decodeForm: a.Content}
		if a.Normalized && t.normalizer != nil {
			// tokenizers decodes a normalized token as its normalized
			// content ("[USR]" under Lowercase decodes as "[usr]").
			at.decodeForm = t.normalizer.normalize(a.Content)
		}
		if byteLevelDec {
			// The ByteLevel decoder maps added tokens' runes to bytes too.
			at.decodeForm = byteLevelDecodeToken(at.decodeForm)
		}
		toks = append(toks, at)
		t.vocabSize = max(t.vocabSize, int(a.ID)+1)
	}
	var normFn func(string) string
	if t.normalizer != nil {
		normFn = t.normalizer.normalize
	}
	t.added = newAddedVocab(toks, normFn)
	if t.post, err = loadPostProcessor(f.PostProcessor); err != nil {
		return nil, fmt.Errorf("load post_processor: %w", err)
	}
	t.prefixSafe = t.pre != nil && t.pre.cutSafe() && !t.added.anyStrip && !t.added.hasNormalized &&
		(t.normalizer == nil || t.normalizer.cutSafe())
	return t, nil
}

type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

func loadNormalizer(raw json.RawMessage) (normalizer, error) {
	c, err := parseComponent(raw)
	if c == nil || err != nil {
		return nil, err
	}
	switch c.Type {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercase{}, nil
	case "StripAccents":
		return stripAccents{}, nil
	case "Strip":
		var v struct {
			Left  bool `json:"strip_left"`
			Right bool `json:"strip_right"`
		}
		if err := c.decode(&v); err != nil {
			return nil, err
		}
		return strip{v.Left, v.Right}, nil
	case "Prepend":
		var v struct {
			Prepend string `json:"prepend"`
		}
		if err := c.decode(&v); err != nil {
			return nil, err
		}
		return prepend{v.Prepend}, nil
	case "Replace":
		r, err := loadReplacer(c)
		return replaceNorm{r}, err
	case "BertNormalizer":
		v := struct {
			CleanText    bool  `json:"clean_text"`
			Chinese      bool  `json:"handle_chinese_chars"`
			StripAccents *bool `json:"strip_accents"`
			Lowercase    bool  `json:"lowercase"`
		}{CleanText: true, Chinese: true, Lowercase: true}
		if err := c.decode(&v); err != nil {
			return nil, err
		}
		sa := v.Lowercase
		if v.StripAccents != nil {
			sa = *v.StripAccents
		}
		return bertNormalizer{v.CleanText, v.Chinese, sa, v.Lowercase}, nil
	case "Sequence":
		var v struct {
			Normalizers []json.RawMessage `json:"normalizers"`
		}
		if err := c.decode(&v); err != nil {
			return nil, err
		}
		var seq normSequence
		for _, r := range v.Normalizers {
			n, err := loadNormalizer(r)
			if err != nil {
				return nil, err
			}
			if n != nil {
				seq = append(seq, n)
			}
		}
		return seq, nil
	}
	return nil, fmt.Errorf("normalizer %q: %w", c.Type, ErrUnsupported)
}

func loadReplacer(c *component) (replacer, error) {
	var v struct {
		Pattern patternJSON `json:"pattern"`
		Content string      `json:"content"`
	}
	if err := c.decode(&v); err != nil {
		return replacer{}, err
	}
	r := replacer{content: v.Content}
	switch {
	case v.Pattern.String != nil:
		r.literal = *v.Pattern.String
	case v.Pattern.Regex != nil:
		re, err := compileOnig(*v.Pattern.Regex)
		if err != nil {
			return r, fmt.Errorf("replace pattern: %w", err)
		}
		r.re = re
	default:
		return r, fmt.Errorf("replace: %w: no pattern", ErrInvalid)
	}
	return r, nil
}

var behaviors = map[string]splitBehavior{
	"Removed": behRemoved, "Isolated": behIsolated, "MergedWithPrevious": behMergedWithPrevious,
	"MergedWithNext": behMergedWithNext, "Contiguous": behContiguous,
}

// loadPreTokenizer also reports whether a ByteLevel step is present (then the
// model's vocabulary is byte-level). mapped says a ByteLevel step ran before
// this one in a Sequence: tokenizers' later steps then see the byte-level
// alphabet (a space is "Ġ", the byte 0xB2 of "в" is "²"), not the text.
func loadPreTokenizer(raw json.RawMessage, mapped bool) (preTokenizer, bool, error) {
	c, err := parseComponent(raw)
	if c == nil || err != nil {
		return nil, false, err
	}
	var p preTokenizer
	switch c.Type {
	case "ByteLevel":
		if mapped {
			return nil, false, fmt.Errorf("pre_tokenizer: a second ByteLevel step: %w", ErrUnsupported)
		}
		v := struct {
			AddPrefixSpace bool `json:"add_prefix_space"`
			UseRegex       bool `json:"use_regex"`
		}{UseRegex: true}
		if err := c.decode(&v); err != nil {
			return nil, false, err
		}
		return &byteLevelPre{v.AddPrefixSpace, v.UseRegex}, true, nil
	case "Sequence":
		return loadPreSequence(c, mapped)
	case "Split":
		p, err = loadSplitPre(c)
	case "Whitespace":
		p = &funcPre{whitespacePre, true}
	case "WhitespaceSplit":
		p = &funcPre{whitespaceSplit, true}
	case "BertPreTokenizer":
		p = &funcPre{bertSplit, true}
	case "Punctuation", "Digits":
		p, err = loadRunePre(c)
	case "Metaspace":
		p, err = loadMetaspacePre(c)
	default:
		return nil, false, fmt.Errorf("pre_tokenizer %q: %w", c.Type, ErrUnsupported)
	}
	if err != nil {
		return nil, false, err
	}
	if mapped {
		p = &mappedPre{p}
	}
	return p, false, nil
}

// loadSplitPre loads a Split pre-tokenizer (regex or literal pattern).
func loadSplitPre(c *component) (preTokenizer, error) {
	v := struct {
		Pattern  patternJSON `json:"pattern"`
		Behavior string      `json:"behavior"`
		Invert   bool        `json:"invert"`
	}{}
	if err := c.decode(&v); err != nil {
		return nil, err
	}
	beh, ok := behaviors[v.Behavior]
	if !ok {
		return nil, fmt.Errorf("split behavior %q: %w", v.Behavior, ErrInvalid)
	}
	var m splitMatcher
	var err error
	switch {
	case v.Pattern.Regex != nil:
		m, err = newSplitMatcher(*v.Pattern.Regex, true)
	case v.Pattern.String != nil:
		m, err = newSplitMatcher(*v.Pattern.String, false)
	default:
		err = fmt.Errorf("split: %w: no pattern", ErrInvalid)
	}
	if err != nil {
		return nil, err
	}
	return &splitPre{m: m, beh: beh, invert: v.Invert}, nil
}

// loadRunePre loads the rune-class splitters Punctuation and Digits.
func loadRunePre(c *component) (preTokenizer, error) {
	if c.Type == "Digits" {
		var v struct {
			Individual bool `json:"individual_digits"`
		}
		if err := c.decode(&v); err != nil {
			return nil, err
		}
		// char::is_numeric: all of N (², ½, Ⅻ), not only decimal digits.
		m := runeMatcher{f: unicode.IsNumber, contiguous: !v.Individual}
		return &splitPre{m: m, beh: behIsolated}, nil
	}
	v := struct {
		Behavior string `json:"behavior"`
	}{Behavior: "Isolated"}
	if err := c.decode(&v); err != nil {
		return nil, err
	}
	beh, ok := behaviors[v.Behavior]
	if !ok {
		return nil, fmt.Errorf("punctuation behavior %q: %w", v.Behavior, ErrInvalid)
	}
	return &splitPre{m: runeMatcher{f: isBertPunct}, beh: beh}, nil
}

func loadMetaspacePre(c *component) (preTokenizer, error) {
	v := struct {
		Replacement    string `json:"replacement"`
		PrependScheme  string `json:"prepend_scheme"`
		AddPrefixSpace *bool  `json:"add_prefix_space"`
		Split          bool   `json:"split"`
	}{Replacement: "▁", Split: true}
	if err := c.decode(&v); err != nil {
		return nil, err
	}
	scheme := v.PrependScheme
	if scheme == "" {
		scheme = "always"
		if v.AddPrefixSpace != nil && !*v.AddPrefixSpace {
			scheme = "never"
		}
	}
	return &metaspacePre{replacement: v.Replacement, scheme: scheme, splitWords: v.Split}, nil
}

// loadPreSequence loads a Sequence; it is byte-level when any step is, and
// the steps after a ByteLevel step run on its alphabet.
func loadPreSequence(c *component, mapped bool) (preTokenizer, bool, error) {
	var v struct {
		Pre []json.RawMessage `json:"pretokenizers"`
	}
	if err := c.decode(&v); err != nil {
		return nil, false, err
	}
	var seq preSequence
	anyByte := false
	for _, r := range v.Pre {
		p, bl, err := loadPreTokenizer(r, mapped || anyByte)
		if err != nil {
			return nil, false, err
		}
		anyByte = anyByte || bl
		if p != nil {
			seq = append(seq, p)
		}
	}
	return seq, anyByte, nil
}

type modelJSON struct {
	Type         string          `json:"type"`
	Vocab        json.RawMessage `json:"vocab"`
	Merges       json.RawMessage `json:"merges"`
	UnkToken     *string         `json:"unk_token"`
	UnkID        *int            `json:"unk_id"`
	ContPrefix   *string         `json:"continuing_subword_prefix"`
	EOWSuffix    *string         `json:"end_of_word_suffix"`
	FuseUnk      bool            `json:"fuse_unk"`
	ByteFallback bool            `json:"byte_fallback"`
	IgnoreMerges bool            `json:"ignore_merges"`
	MaxChars     *int            `json:"max_input_chars_per_word"`
}

func loadModel(raw json.RawMessage, byteLevel bool) (model, error) {
	m, err := decodeModelJSON(raw)
	if err != nil {
		return nil, err
	}
	switch m.Type {
	case "BPE":
		return loadBPE(m, byteLevel)
	case "WordPiece":
		vocab, err := scanVocab(m.Vocab)
		if err != nil {
			return nil, err
		}
		maxChars := 100
		if m.MaxChars != nil {
			maxChars = *m.MaxChars
		}
		unk := strOr(m.UnkToken, "[UNK]")
		if _, ok := vocab[unk]; !ok {
			return nil, errMissingUnk(m.Type, unk)
		}
		return newWordPiece(vocab, strOr(m.ContPrefix, "##"), unk, maxChars), nil
	case "WordLevel":
		vocab, err := scanVocab(m.Vocab)
		if err != nil {
			return nil, err
		}
		wl := &wordLevel{vocab: vocab}
		wl.vocabR, wl.has = reverseVocab(vocab)
		unk := strOr(m.UnkToken, "")
		if wl.unk, wl.hasUnk = vocab[unk]; !wl.hasUnk {
			return nil, errMissingUnk(m.Type, unk)
		}
		return wl, nil
	case "Unigram":
		return loadUnigram(m)
	}
	return nil, fmt.Errorf("model %q: %w", m.Type, ErrUnsupported)
}

// errMissingUnk refuses a model whose unknown token is not in its
// vocabulary: tokenizers fails to encode any text with a word the model
// cannot spell ("Missing [UNK] token from the vocabulary"), where Native
// would have dropped the word and keyed the request on ids the engine never
// produces. ErrUnsupported lets the ingress key such a model on the engine's
// /tokenize instead.
func errMissingUnk(model, unk string) error {
	return fmt.Errorf("%s: unknown token %q is not in the vocabulary (tokenizers fails on unknown words): %w", model, unk, ErrUnsupported)
}

func strOr(p *string, def string) string {
	if p == nil {
		return def
	}
	return *p
}

// decodeModelJSON reads the model's small fields with encoding/json and
// keeps vocab and merges raw (internal/jsonscan reads those); an untagged
// model's type is inferred as the tokenizers library does.
func decodeModelJSON(raw json.RawMessage) (*modelJSON, error) {
	if isNull(raw) {
		return nil, fmt.Errorf("%w: no model", ErrInvalid)
	}
	members, err := fields(raw)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	small := []byte{'{'}
	for k, v := range members {
		if k == "vocab" || k == "merges" {
			continue
		}
		if len(small) > 1 {
			small = append(small, ',')
		}
		small = strconv.AppendQuote(small, k)
		small = append(small, ':')
		small = append(small, v...)
	}
	small = append(small, '}')
	var m modelJSON
	if err := json.Unmarshal(small, &m); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	m.Vocab, m.Merges = members["vocab"], members["merges"]
	if m.Type == "" { // older files leave the model untagged
		switch {
		case !isNull(m.Merges):
			m.Type = "BPE"
		case m.MaxChars != nil:
			m.Type = "WordPiece"
		case m.UnkID != nil:
			m.Type = "Unigram"
		default:
			m.Type = "WordLevel"
		}
	}
	return &m, nil
}

func loadBPE(m *modelJSON, byteLevel bool) (model, error) {
	vocab, err := scanVocab(m.Vocab)
	if err != nil {
		return nil, err
	}
	var merges [][2]string
	if !isNull(m.Merges) {
		if merges, err = scanMerges(m.Merges); err != nil {
			return nil, err
		}
	}
	opts := bpe{byteLevel: byteLevel, ignoreMerges: m.IgnoreMerges, byteFallback: m.ByteFallback,
		fuseUnk: m.FuseUnk, contPrefix: strOr(m.ContPrefix, ""), eowSuffix: strOr(m.EOWSuffix, ""), unk: -1}
	absentUnk := false
	if m.UnkToken != nil {
		if id, ok := vocab[*m.UnkToken]; ok {
			opts.unk = int64(id)
		} else {
			absentUnk = true
		}
	}
	b, err := newBPE(vocab, merges, opts)
	if err != nil {
		return nil, err
	}
	if !absentUnk {
		return b, nil
	}
	// tokenizers fails on a character it cannot spell when the unk_token it
	// names is missing (without an unk_token it drops the character, as
	// Native does). Such a character cannot occur when every byte has a
	// token, as in byte-level vocabularies.
	if !b.spellsEveryByte() {
		return nil, errMissingUnk(m.Type, *m.UnkToken)
	}
	return b, nil
}

func loadUnigram(m *modelJSON) (model, error) {
	var entries [][2]json.RawMessage
	if err := json.Unmarshal(m.Vocab, &entries); err != nil {
		return nil, fmt.Errorf("unigram vocab: %w: %v", ErrInvalid, err)
	}
	pieces := make([]string, len(entries))
	scores := make([]float64, len(entries))
	for i, e := range entries {
		if err := errors.Join(json.Unmarshal(e[0], &pieces[i]), json.Unmarshal(e[1], &scores[i])); err != nil {
			return nil, fmt.Errorf("unigram vocab %d: %w: %v", i, ErrInvalid, err)
		}
	}
	unk := -1
	if m.UnkID != nil {
		unk = *m.UnkID
		if unk < 0 || unk >= len(pieces) {
			return nil, fmt.Errorf("unigram unk_id %d: %w: not in the vocabulary", unk, ErrInvalid)
		}
	}
	if unk < 0 { // tokenizers fails on any unknown character then, byte fallback or not
		return nil, errMissingUnk(m.Type, "unk_id")
	}
	return newUnigram(pieces, scores, unk, m.ByteFallback), nil
}

// toRawBytes rewrites a byte-level vocabulary as raw bytes.
func toRawBytes(vocab map[string]uint32) map[string]uint32 {
	out := make(map[string]uint32, len(vocab))
	for tok, id := range vocab {
		raw, ok := byteLevelDecodeString(tok)
		if !ok {
			raw = tok
		}
		if _, dup := out[raw]; !dup {
			out[raw] = id
		}
	}
	return out
}

type processorJSON struct {
	Type          string                       `json:"type"`
	Single        []map[string]json.RawMessage `json:"single"`
	SpecialTokens map[string]struct {
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
	Cls        []json.RawMessage `json:"cls"`
	Sep        []json.RawMessage `json:"sep"`
	Processors []json.RawMessage `json:"processors"`
}

func loadPostProcessor(raw json.RawMessage) (postProcessor, error) {
	p, err := loadAffix(raw)
	if p == nil || err != nil {
		return nil, err
	}
	return p, nil
}

func loadAffix(raw json.RawMessage) (*affixProcessor, error) {
	if isNull(raw) {
		return nil, nil
	}
	var v processorJSON
	if err := json.Unmarshal(raw, &v); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	switch v.Type {
	case "ByteLevel":
		return &affixProcessor{}, nil
	case "TemplateProcessing":
		p := &affixProcessor{}
		seen := false
		for _, item := range v.Single {
			if _, ok := item["Sequence"]; ok {
				seen = true
				continue
			}
			st, ok := item["SpecialToken"]
			if !ok {
				return nil, fmt.Errorf("template: %w: unknown piece", ErrInvalid)
			}
			var s struct {
				ID string `json:"id"`
			}
			if err := json.Unmarshal(st, &s); err != nil {
				return nil, fmt.Errorf("template: %w: %v", ErrInvalid, err)
			}
			tok, ok := v.SpecialTokens[s.ID]
			if !ok {
				return nil, fmt.Errorf("template: %w: special token %q not defined", ErrInvalid, s.ID)
			}
			if seen {
				p.suffix = append(p.suffix, tok.IDs...)
			} else {
				p.prefix = append(p.prefix, tok.IDs...)
			}
		}
		return p, nil
	case "BertProcessing", "RobertaProcessing":
		if len(v.Cls) != 2 || len(v.Sep) != 2 {
			return nil, fmt.Errorf("%s: %w: cls/sep", v.Type, ErrInvalid)
		}
		var cls, sep uint32
		if err := errors.Join(json.Unmarshal(v.Cls[1], &cls), json.Unmarshal(v.Sep[1], &sep)); err != nil {
			return nil, fmt.Errorf("%s: %w: %v", v.Type, ErrInvalid, err)
		}
		return &affixProcessor{prefix: []uint32{cls}, suffix: []uint32{sep}}, nil
	case "Sequence":
		p := &affixProcessor{}
		for _, r := range v.Processors {
			q, err := loadAffix(r)
			if err != nil {
				return nil, err
			}
			if q != nil {
				p = p.then(q)
			}
		}
		return p, nil
	}
	return nil, fmt.Errorf("post_processor %q: %w", v.Type, ErrUnsupported)
}

// loadDecoder also reports whether a ByteLevel step is present.
func loadDecoder(raw json.RawMessage, rawBytes bool) (decoder, bool, error) {
	c, err := parseComponent(raw)
	if c == nil || err != nil {
		return nil, false, err
	}
	switch c.Type {
	case "ByteLevel":
		return byteLevelDecoder(rawBytes), true, nil
	case "WordPiece":
		v := struct {
			Prefix  string `json:"prefix"`
			Cleanup bool   `json:"cleanup"`
		}{Prefix: "##", Cleanup: true}
		if err := c.decode(&v); err != nil {
			return nil, false, err
		}
		return wordPieceDecoder(v.Prefix, v.Cleanup), false, nil
	case "Metaspace":
		v := struct {
			Replacement    string `json:"replacement"`
			PrependScheme  string `json:"prepend_scheme"`
			AddPrefixSpace *bool  `json:"add_prefix_space"`
		}{Replacement: "▁"}
		if err := c.decode(&v); err != nil {
			return nil, false, err
		}
		strip := v.PrependScheme != "never"
		if v.PrependScheme == "" && v.AddPrefixSpace != nil {
			strip = *v.AddPrefixSpace
		}
		return metaspaceDecoder(v.Replacement, strip), false, nil
	case "ByteFallback":
		return byteFallbackDecoder(), false, nil
	case "Fuse":
		return fuseDecoder(), false, nil
	case "Strip":
		var v struct {
			Content string `json:"content"`
			Start   int    `json:"start"`
			Stop    int    `json:"stop"`
		}
		if err := c.decode(&v); err != nil {
			return nil, false, err
		}
		return stripDecoder(v.Content, v.Start, v.Stop), false, nil
	case "Replace":
		r, err := loadReplacer(c)
		return replaceDecoder(r), false, err
	case "BPEDecoder":
		v := struct {
			Suffix string `json:"suffix"`
		}{Suffix: "</w>"}
		if err := c.decode(&v); err != nil {
			return nil, false, err
		}
		return bpeDecoder(v.Suffix), false, nil
	case "Sequence":
		var v struct {
			Decoders []json.RawMessage `json:"decoders"`
		}
		if err := c.decode(&v); err != nil {
			return nil, false, err
		}
		var seq decoderSequence
		anyByte := false
		for _, r := range v.Decoders {
			d, bl, err := loadDecoder(r, rawBytes)
			if err != nil {
				return nil, false, err
			}
			anyByte = anyByte || bl
			if d != nil {
				seq = append(seq, d)
			}
		}
		return seq, anyByte, nil
	}
	return nil, false, fmt.Errorf("decoder %q: %w", c.Type, ErrUnsupported)
}
