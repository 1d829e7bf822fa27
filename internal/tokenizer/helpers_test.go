package tokenizer

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
)

// The tokenizer files ship in the Go module github.com/daulet/tokenizers
// (required in go.mod); `go mod download` finds or fetches it.
var (
	dataDirOnce sync.Once
	dataDir     string
	dataDirErr  error
)

func tokenizerDataDir(t testing.TB) string {
	t.Helper()
	dataDirOnce.Do(func() {
		out, err := exec.Command("go", "mod", "download", "-json", "github.com/daulet/tokenizers").Output()
		if err != nil {
			dataDirErr = err
			return
		}
		var v struct{ Dir string }
		if dataDirErr = json.Unmarshal(out, &v); dataDirErr == nil {
			dataDir = filepath.Join(v.Dir, "test", "data")
		}
	})
	if dataDirErr != nil || dataDir == "" {
		t.Fatalf("locate github.com/daulet/tokenizers test data: %v", dataDirErr)
	}
	return dataDir
}

var (
	loadedMu sync.Mutex
	loaded   = map[string]*Native{}
)

// loadNamed loads (once per test binary) a tokenizer file from the module's test data.
func loadNamed(t testing.TB, name string) *Native {
	t.Helper()
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if tk, ok := loaded[name]; ok {
		return tk
	}
	tk, err := LoadFile(filepath.Join(tokenizerDataDir(t), name+".json"))
	if err != nil {
		t.Fatalf("load %s: %v", name, err)
	}
	loaded[name] = tk
	return tk
}

type goldenCase struct {
	Text       string   `json:"text"`
	IDsSpecial []uint32 `json:"ids_special"`
	IDsPlain   []uint32 `json:"ids_plain"`
}

type goldenModel struct {
	Cases    []goldenCase `json:"cases"`
	LongText goldenCase   `json:"long_text"`
	HFRate   float64      `json:"hf_tokens_per_s_single_core"`
}

var (
	goldenOnce sync.Once
	golden     map[string]json.RawMessage
)

func loadGolden(t testing.TB, name string) goldenModel {
	t.Helper()
	goldenOnce.Do(func() {
		b, err := os.ReadFile("../../testdata/tokenizer/golden.json")
		if err != nil {
			t.Fatalf("read golden: %v", err)
		}
		if err := json.Unmarshal(b, &golden); err != nil {
			t.Fatalf("parse golden: %v", err)
		}
	})
	var g goldenModel
	if err := json.Unmarshal(golden[name], &g); err != nil {
		t.Fatalf("parse golden %s: %v", name, err)
	}
	return g
}

func longText(t testing.TB) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(tokenizerDataDir(t), "long_text.txt"))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var modelNames = []string{"Meta-Llama-3-8B-Instruct", "bert-base-uncased", "cohere-tokenizer"}

func firstDiff(a, b []uint32) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return min(len(a), len(b))
	}
	return -1
}
