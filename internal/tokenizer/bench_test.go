package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unsafe"
)

// withoutWordCache returns a copy of t whose BPE model has no word cache.
func withoutWordCache(t *Native) *Native {
	n := &Native{added: t.added, normalizer: t.normalizer, pre: t.pre, post: t.post, decoder: t.decoder,
		byteLevel: t.byteLevel, prefixSafe: t.prefixSafe, vocabSize: t.vocabSize, model: t.model}
	if m, ok := t.model.(*bpe); ok {
		c := *m
		c.cache = nil
		n.model = &c
	}
	return n
}

// BenchmarkEncodeLongText is the cold single-core speed on long_text.txt
// (reference: golden.json's hf_tokens_per_s_single_core). Run with -cpu 1.
//
// The BPE word cache is warm after the first iteration, as the reference
// library's own cache is in its measurement; the -nowordcache variants show
// the first-pass speed.
func BenchmarkEncodeLongText(b *testing.B) {
	for _, name := range append(slices.Clone(modelNames), "Meta-Llama-3-8B-Instruct-nowordcache", "cohere-tokenizer-nowordcache") {
		b.Run(name, func(b *testing.B) {
			base, noCache := strings.CutSuffix(name, "-nowordcache")
			tk := loadNamed(b, base)
			if noCache {
				tk = withoutWordCache(tk)
			}
			text := longText(b)
			ids := tk.Encode(text, true)
			dst := make([]uint32, 0, len(ids)+16)
			b.SetBytes(int64(len(text)))
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				dst = tk.AppendEncode(dst[:0], text, true)
			}
			b.ReportMetric(float64(len(ids))*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
		})
	}
}

// prefixTexts builds a 4,096-token prefix of long_text.txt and a 256-token
// new suffix (also from a different part of it).
func prefixTexts(b *testing.B, tk *Native) (prefix, suffix string) {
	text := longText(b)
	cut := func(s string, n int) string {
		lo, hi := 0, len(s)
		for lo < hi { // smallest byte length with >= n tokens
			mid := (lo + hi) / 2
			if len(tk.Encode(s[:mid], false)) >= n {
				hi = mid
			} else {
				lo = mid + 1
			}
		}
		return s[:lo]
	}
	prefix = cut(text, 4096)
	suffix = cut(text[len(text)/2:], 256)
	return prefix, suffix
}

// BenchmarkPrefixCache: 4,096 shared tokens plus 256 new ones, warm cache vs cold.
func BenchmarkPrefixCache(b *testing.B) {
	tk := loadNamed(b, "Meta-Llama-3-8B-Instruct")
	prefix, suffix := prefixTexts(b, tk)
	req := prefix + " " + suffix
	n := len(tk.Encode(req, true))
	b.Run("cold", func(b *testing.B) {
		dst := make([]uint32, 0, n+16)
		b.ReportAllocs()
		for b.Loop() {
			dst = tk.AppendEncode(dst[:0], req, true)
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	})
	b.Run("cached", func(b *testing.B) {
		c, err := NewCachingTokenizer(tk, DefaultCacheConfig())
		if err != nil {
			b.Fatal(err)
		}
		c.Encode(prefix+" warm-up", true)
		dst := make([]uint32, 0, n+16)
		// A different suffix every time, so its chunks miss and are encoded
		// cold. The request is a string view of a byte buffer whose digits
		// change in place, so building it costs nothing (the cache keeps ids
		// and hashes, never the text).
		buf := []byte(prefix + " 00000000" + suffix)
		digits := buf[len(prefix)+1 : len(prefix)+9]
		req := unsafe.String(&buf[0], len(buf))
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			for k, v := 7, i; k >= 0; k, v = k-1, v/10 {
				digits[k] = byte('0' + v%10)
			}
			dst = c.AppendEncode(dst[:0], req, true)
		}
		b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
	})
}

// BenchmarkChatRender: rendering one chat_golden conversation with the Llama 3
// template and encoding it.
func BenchmarkChatRender(b *testing.B) {
	raw, err := os.ReadFile("../../testdata/tokenizer/chat_golden.json")
	if err != nil {
		b.Fatal(err)
	}
	var g chatGolden
	if err := json.Unmarshal(raw, &g); err != nil {
		b.Fatal(err)
	}
	ct, err := LoadChatTemplateFile(filepath.Join(tokenizerDataDir(b), "meta-llama-3-8b-instruct", "tokenizer_config.json"))
	if err != nil {
		b.Fatal(err)
	}
	tk := loadNamed(b, "Meta-Llama-3-8B-Instruct")
	msgs := g.Cases[0].Messages
	dst := make([]uint32, 0, 4096)
	b.ReportAllocs()
	for b.Loop() {
		s, err := ct.Render(msgs, true)
		if err != nil {
			b.Fatal(err)
		}
		dst = tk.AppendEncode(dst[:0], s, false)
	}
}

// BenchmarkRenderPromptInlineImage: RenderPrompt of a chat turn carrying a
// 12 MB base64 image (both renderings, the media key), with Qwen3-VL's
// template.
func BenchmarkRenderPromptInlineImage(b *testing.B) {
	src, err := os.ReadFile(templatesDir + "ardan-Qwen3-VL-30B-A3B-Instruct-Q8_0.jinja")
	if err != nil {
		b.Fatal(err)
	}
	ct, err := NewChatTemplate(string(src), nil)
	if err != nil {
		b.Fatal(err)
	}
	msgs := []byte(`[{"role":"user","content":[{"type":"text","text":"What is in this photo?"},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,` +
		strings.Repeat("QUJD", 3<<20) + `"}}]}]`)
	b.SetBytes(int64(len(msgs)))
	b.ReportAllocs()
	for b.Loop() {
		if p, err := ct.RenderPrompt(&ChatRequest{Messages: msgs, AddGenerationPrompt: true}); err != nil || len(p.Media) != 1 {
			b.Fatal(p.Media, err)
		}
	}
}
