//go:build hftokenizers

package tokenizer

import (
	"path/filepath"
	"slices"
	"testing"
)

// TestHFMatchesNative runs where libtokenizers.a is installed
// (go test -tags hftokenizers): both backends give the golden ids.
func TestHFMatchesNative(t *testing.T) {
	for _, name := range modelNames {
		hf, err := LoadFileHF(filepath.Join(tokenizerDataDir(t), name+".json"))
		if err != nil {
			t.Fatal(err)
		}
		for i, c := range loadGolden(t, name).Cases {
			if got := hf.Encode(c.Text, true); !slices.Equal(got, c.IDsSpecial) {
				t.Errorf("%s case %d: hf ids differ from golden", name, i)
			}
		}
		if err := hf.Close(); err != nil {
			t.Fatal(err)
		}
		_ = hf.Close()
	}
}
