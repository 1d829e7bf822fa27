package tokenizer

import (
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkLoadLlama3 is the start-up cost of the 9 MB Llama 3 tokenizer.json.
func BenchmarkLoadLlama3(b *testing.B) {
	data, err := os.ReadFile(filepath.Join(tokenizerDataDir(b), "Meta-Llama-3-8B-Instruct.json"))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Load(data); err != nil {
			b.Fatal(err)
		}
	}
}
