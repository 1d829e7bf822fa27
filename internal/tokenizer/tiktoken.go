package tokenizer

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Tokenizers shipped as a tiktoken BPE file (tiktoken.model: one "base64
// token, rank" per line) plus tokenizer_config.json (Kimi K2, Meta's original
// Llama 3 files) are loaded by converting them the way transformers'
// TikTokenConverter does: a byte-level BPE whose merges come from the ranks
// (every split of a token into two tokens, ordered by the token's rank), with
// ignore_merges (a whole pre-token in the vocabulary is one token, as in
// tiktoken), the split pattern as pre-tokenizer, and the config's
// added_tokens_decoder as special tokens. Ids between the last rank and
// rank+256 that the config does not name are reserved tokens
// <|reserved_token_ID|> (Kimi's convention), so the vocabulary size matches.

// Split patterns of the tiktoken models (not stored in their files).
const (
	// TiktokenPatternLlama3 is Meta's Llama 3 pattern (llama/tokenizer.py).
	TiktokenPatternLlama3 = llama3Pattern
	// TiktokenPatternKimi is Kimi K2's (tokenization_kimi.py).
	TiktokenPatternKimi = `[\p{Han}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// tiktokenReserved is how many special ids follow the ranks.
const tiktokenReserved = 256

// LoadTiktoken loads a tiktoken BPE file and its tokenizer_config.json, with
// pattern as the pre-tokenizer's split (TiktokenPatternLlama3,
// TiktokenPatternKimi). A BOS is added with special tokens only when the
// config sets add_bos_token.
func LoadTiktoken(modelPath, configPath, pattern string) (*Native, error) {
	ranks, err := readTiktoken(modelPath)
	if err != nil {
		return nil, err
	}
	cfgData, err := os.ReadFile(configPath)
	if err != nil {
		return nil, fmt.Errorf("load tiktoken config: %w", err)
	}
	data, err := tiktokenJSON(ranks, cfgData, pattern)
	if err != nil {
		return nil, err
	}
	return Load(data)
}

// readTiktoken returns the tokens (raw bytes) indexed by rank.
func readTiktoken(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("load tiktoken: %w", err)
	}
	defer f.Close()
	return parseTiktoken(f)
}

// parseTiktoken reads "base64 rank" lines, ranks 0, 1, 2, … in order.
func parseTiktoken(r io.Reader) ([]string, error) {
	var toks []string
	sc := bufio.NewScanner(r)
	for line := 1; sc.Scan(); line++ {
		b64, rank, ok := strings.Cut(strings.TrimSpace(sc.Text()), " ")
		if !ok && b64 == "" {
			continue
		}
		tok, err1 := base64.StdEncoding.DecodeString(b64)
		r, err2 := strconv.Atoi(rank)
		if !ok || err1 != nil || err2 != nil || r != len(toks) {
			return nil, fmt.Errorf("load tiktoken: %w: line %d: want \"base64 rank\" with ranks 0, 1, 2, …", ErrInvalid, line)
		}
		toks = append(toks, string(tok))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("load tiktoken: %w", err)
	}
	if len(toks) < 256 {
		return nil, fmt.Errorf("load tiktoken: %w: %d ranks", ErrInvalid, len(toks))
	}
	return toks, nil
}

type tiktokenConfig struct {
	Added map[string]struct {
		Content    string `json:"content"`
		Special    bool   `json:"special"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		SingleWord bool   `json:"single_word"`
	} `json:"added_tokens_decoder"`
	AddBOS *bool           `json:"add_bos_token"`
	BOS    json.RawMessage `json:"bos_token"`
}

// tiktokenJSON writes the tokenizer.json the conversion produces.
func tiktokenJSON(ranks []string, cfgData []byte, pattern string) ([]byte, error) {
	var cfg tiktokenConfig
	if err := json.Unmarshal(cfgData, &cfg); err != nil {
		return nil, fmt.Errorf("parse tokenizer_config: %w: %v", ErrInvalid, err)
	}
	var b bytes.Buffer
	b.WriteString(`{"version":"1.0","truncation":null,"padding":null,"added_tokens":`)
	added, err := tiktokenAdded(&cfg, len(ranks))
	if err != nil {
		return nil, err
	}
	b.Write(added)
	b.WriteString(`,"normalizer":null,"pre_tokenizer":{"type":"Sequence","pretokenizers":[{"type":"Split","pattern":{"Regex":`)
	writeJSONString(&b, pattern)
	b.WriteString(`},"behavior":"Isolated","invert":false},{"type":"ByteLevel","add_prefix_space":false,"trim_offsets":true,"use_regex":false}]},`)
	b.WriteString(`"post_processor":`)
	b.Write(tiktokenPost(&cfg))
	b.WriteString(`,"decoder":{"type":"ByteLevel","add_prefix_space":true,"trim_offsets":true,"use_regex":true},`)
	b.WriteString(`"model":{"type":"BPE","dropout":null,"unk_token":null,"continuing_subword_prefix":null,"end_of_word_suffix":null,"fuse_unk":false,"byte_fallback":false,"ignore_merges":true,"vocab":{`)
	for r, t := range ranks {
		if r > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, byteLevelEncodeString(t))
		b.WriteByte(':')
		b.WriteString(strconv.Itoa(r))
	}
	b.WriteString(`},"merges":[`)
	for i, m := range tiktokenMerges(ranks) {
		if i > 0 {
			b.WriteByte(',')
		}
		writeJSONString(&b, byteLevelEncodeString(m[0])+" "+byteLevelEncodeString(m[1]))
	}
	b.WriteString(`]}}`)
	return b.Bytes(), nil
}

// tiktokenMerges derives merges from ranks as transformers' converter does:
// for each token in rank order, every split into two tokens of the
// vocabulary, ordered by the ranks of the two parts.
func tiktokenMerges(ranks []string) [][2]string {
	rank := make(map[string]int, len(ranks))
	for r, t := range ranks {
		rank[t] = r
	}
	var out [][2]string
	var local [][2]string
	for _, t := range ranks {
		local = local[:0]
		for i := 1; i < len(t); i++ {
			l, r := t[:i], t[i:]
			if _, ok := rank[l]; !ok {
				continue
			}
			if _, ok := rank[r]; ok {
				local = append(local, [2]string{l, r})
			}
		}
		slices.SortStableFunc(local, func(a, b [2]string) int {
			if c := rank[a[0]] - rank[b[0]]; c != 0 {
				return c
			}
			return rank[a[1]] - rank[b[1]]
		})
		out = append(out, local...)
	}
	return out
}

// tiktokenAdded lists the config's added tokens and names the other
// reserved ids.
func tiktokenAdded(cfg *tiktokenConfig, base int) ([]byte, error) {
	type added struct {
		ID         int    `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
		Normalized bool   `json:"normalized"`
		Special    bool   `json:"special"`
	}
	byID := map[int]added{}
	for k, v := range cfg.Added {
		id, err := strconv.Atoi(k)
		if err != nil || id < base {
			return nil, fmt.Errorf("parse tokenizer_config: %w: added token id %q", ErrInvalid, k)
		}
		byID[id] = added{id, v.Content, v.SingleWord, v.LStrip, v.RStrip, v.Normalized, v.Special}
	}
	end := base + tiktokenReserved
	for id := range byID {
		end = max(end, id+1)
	}
	list := make([]added, 0, end-base)
	for id := base; id < end; id++ {
		a, ok := byID[id]
		if !ok {
			a = added{ID: id, Content: fmt.Sprintf("<|reserved_token_%d|>", id), Special: true}
		}
		list = append(list, a)
	}
	return json.Marshal(list)
}

// tiktokenPost adds the BOS when the config asks for it.
func tiktokenPost(cfg *tiktokenConfig) []byte {
	bos, ok := tokenContent(cfg.BOS)
	if cfg.AddBOS == nil || !*cfg.AddBOS || !ok || bos == "" {
		return []byte("null")
	}
	id := -1
	for k, v := range cfg.Added {
		if v.Content == bos {
			id, _ = strconv.Atoi(k)
		}
	}
	if id < 0 {
		return []byte("null")
	}
	q, _ := json.Marshal(bos)
	return []byte(fmt.Sprintf(`{"type":"TemplateProcessing","single":[{"SpecialToken":{"id":%s,"type_id":0}},{"Sequence":{"id":"A","type_id":0}}],`+
		`"pair":[{"SpecialToken":{"id":%s,"type_id":0}},{"Sequence":{"id":"A","type_id":0}},{"Sequence":{"id":"B","type_id":1}}],`+
		`"special_tokens":{%s:{"id":%s,"ids":[%d],"tokens":[%s]}}}`, q, q, q, q, id, q))
}

func writeJSONString(b *bytes.Buffer, s string) {
	q, _ := json.Marshal(s)
	b.Write(q)
}
