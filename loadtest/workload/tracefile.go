package workload

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
)

// MaxTraceTokens bounds a trace row's prompt and output lengths (16 Mi
// tokens, far past any model's context): every trace reader refuses a
// longer row, naming the line and the bound. A row of 2·10^9 tokens made
// the discrete-event benchmark allocate the prompt's 8 GB of token ids.
const MaxTraceTokens = 1 << 24

// utf8BOM is the byte-order mark some editors and spreadsheet exports put
// at the start of a UTF-8 file.
var utf8BOM = []byte{0xEF, 0xBB, 0xBF}

// compressed are the magic numbers of compressed formats the readers do not
// decompress, for an error that says what the file is.
var compressed = []struct {
	magic []byte
	name  string
}{
	{[]byte{0x28, 0xB5, 0x2F, 0xFD}, "zstd"},
	{[]byte("BZh"), "bzip2"},
	{[]byte{0xFD, '7', 'z', 'X', 'Z', 0x00}, "xz"},
	{[]byte("PK\x03\x04"), "zip"},
}

// traceText is a trace file's text: r decompressed when it is gzipped
// (magic 1f 8b; traces are often shipped as .jsonl.gz or .csv.gz), less a
// leading UTF-8 byte-order mark. Other compressed formats are an error
// naming the format.
func traceText(r io.Reader) (io.Reader, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	if b, _ := br.Peek(2); len(b) == 2 && b[0] == 0x1f && b[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return nil, fmt.Errorf("%w: gzipped trace: %w", ErrBadWorkload, err)
		}
		br = bufio.NewReaderSize(gunzip{zr}, 64<<10)
	}
	for _, c := range compressed {
		if b, _ := br.Peek(len(c.magic)); bytes.Equal(b, c.magic) {
			return nil, fmt.Errorf("%w: the trace is %s-compressed: decompress it first (gzip is read as it is)", ErrBadWorkload, c.name)
		}
	}
	if b, _ := br.Peek(len(utf8BOM)); bytes.Equal(b, utf8BOM) {
		_, _ = br.Discard(len(utf8BOM))
	}
	return br, nil
}

// gunzip names decompression in its errors (a truncated or corrupt gzip
// file would otherwise report a bare "unexpected EOF" at some line).
type gunzip struct{ r io.Reader }

func (g gunzip) Read(p []byte) (int, error) {
	n, err := g.r.Read(p)
	if err != nil && err != io.EOF {
		err = fmt.Errorf("decompressing the gzipped trace: %w", err)
	}
	return n, err
}
