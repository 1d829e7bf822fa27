// Package tokenizer turns text and chats into token ids exactly as the
// Hugging Face tokenizers library does for the same tokenizer.json, so the
// router's block keys match the engine's.
//
// It owns: loading tokenizer.json (Load, LoadFile, LoadDir) into Native, a
// pure-Go, cgo-free pipeline — added/special tokens (leftmost-longest, with
// lstrip/rstrip/single_word), normalizers (NFC/NFD/NFKC/NFKD, Lowercase,
// StripAccents, Strip, Replace, Prepend, BertNormalizer, Sequence),
// pre-tokenizers (ByteLevel, Split, Whitespace, WhitespaceSplit,
// BertPreTokenizer, Punctuation, Digits, Metaspace, Sequence), models (BPE
// with ignore_merges/byte_fallback/unk fusing, WordPiece, WordLevel, Unigram),
// post-processors (TemplateProcessing, BertProcessing, RobertaProcessing,
// ByteLevel, Sequence) and decoders (ByteLevel, WordPiece, Metaspace,
// ByteFallback, Fuse, Strip, Replace, BPEDecoder, Sequence). Unsupported parts
// (e.g. the Precompiled normalizer) fail at load with ErrUnsupported.
//
// Split patterns: GPT-2's and Llama 3's (cl100k, and Qwen2's variant) are
// matched by hand-written code, exactly and without allocating — Go's regexp
// has no lookahead for `\s+(?!\S)`; any other pattern runs on
// github.com/dlclark/regexp2. A fuzz test checks the hand-written matchers
// against regexp2.
//
// Chat templates (ChatTemplate, in chat.go) render tokenizer_config.json's
// Jinja chat_template with the interpreter in subpackage chattmpl, with
// transformers' settings (trim_blocks, lstrip_blocks, raise_exception,
// namespace, tojson); encode the result with addSpecialTokens=false as vLLM does.
//
// CachingTokenizer (cache.go) is the prefix-aware cache of the request path:
// chunks of text ending at cut points the pipeline cannot merge across are
// cached by a hash chain of everything before them, so a shared system prompt
// or a growing chat is tokenized once; ids are always identical to a cold run.
//
// With the build tag hftokenizers, HF (hf.go) wraps github.com/daulet/tokenizers
// (the Rust library over cgo, needs libtokenizers.a) behind the same
// Tokenizer interface. The default build never links it.
//
// It must not touch: block keys (kvevents), the index or the network; it
// only maps text to ids and back. Everything here is safe for concurrent use
// after construction.
package tokenizer
