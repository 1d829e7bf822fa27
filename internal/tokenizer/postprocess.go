package tokenizer

// postProcessor adds the special tokens of a single sequence. Every
// post-processor of tokenizers (TemplateProcessing, BertProcessing,
// RobertaProcessing, ByteLevel, Sequence) reduces, for one sequence and
// without truncation, to fixed ids before and after it.
type postProcessor interface {
	apply(dst []uint32, start int) []uint32
}

type affixProcessor struct {
	prefix, suffix []uint32
}

var _ postProcessor = (*affixProcessor)(nil)

// apply wraps dst[start:] in prefix and suffix.
func (p *affixProcessor) apply(dst []uint32, start int) []uint32 {
	if n := len(p.prefix); n > 0 {
		old := len(dst)
		dst = append(dst, p.prefix...)
		copy(dst[start+n:], dst[start:old])
		copy(dst[start:], p.prefix)
	}
	return append(dst, p.suffix...)
}

// then composes: p applied first, q around it.
func (p *affixProcessor) then(q *affixProcessor) *affixProcessor {
	pre := append(append([]uint32{}, q.prefix...), p.prefix...)
	suf := append(append([]uint32{}, p.suffix...), q.suffix...)
	return &affixProcessor{pre, suf}
}
