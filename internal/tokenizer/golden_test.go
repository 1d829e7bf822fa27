package tokenizer

import (
	"testing"
)

// TestGolden compares every case of golden.json (ids from the Hugging Face
// Rust library) with and without special tokens, for all three files.
func TestGolden(t *testing.T) {
	for _, name := range modelNames {
		t.Run(name, func(t *testing.T) {
			tk := loadNamed(t, name)
			g := loadGolden(t, name)
			if len(g.Cases) == 0 {
				t.Fatal("no golden cases")
			}
			cases := append([]goldenCase{}, g.Cases...)
			if !raceEnabled {
				lt := g.LongText
				lt.Text = longText(t)
				lt.IDsPlain = lt.IDsSpecial // only ids_special is recorded
				cases = append(cases, lt)
			}
			for i, c := range cases {
				for _, special := range []bool{false, true} {
					if i == len(g.Cases) && !special {
						continue
					}
					want := c.IDsPlain
					if special {
						want = c.IDsSpecial
					}
					got := tk.Encode(c.Text, special)
					if again := tk.Encode(c.Text, special); firstDiff(again, got) >= 0 {
						t.Errorf("case %d: second encode (BPE word cache warm) differs", i)
					}
					if d := firstDiff(got, want); d >= 0 {
						lo, hi := max(0, d-3), min(d+4, len(got), len(want))
						t.Errorf("case %d special=%v: first diff at %d: got %v want %v (text %.80q)",
							i, special, d, got[lo:min(hi, len(got))], want[lo:min(hi, len(want))], c.Text)
					}
				}
			}
		})
	}
}
