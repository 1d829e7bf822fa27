package autoscale

import (
	"fmt"
	"testing"
)

func TestRepairRatio(t *testing.T) {
	band := Ratio{Numerator: "p", Denominator: "d", Min: 0.5, Max: 2}
	wide := Bounds{0, 10}
	cases := []struct {
		name                 string
		num, den             int32
		nb, db               Bounds
		r                    Ratio
		wantN, wantD         int32
		adjusted, infeasible bool
	}{
		{"within band", 2, 3, wide, wide, band, 2, 3, false, false},
		{"both at zero", 0, 0, wide, wide, band, 0, 0, false, false},
		{"numerator at zero is seeded", 0, 2, wide, wide, band, 1, 2, true, false},
		{"denominator at zero is seeded", 2, 0, wide, wide, band, 2, 1, true, false},
		{"numerator at zero seeded then raised", 0, 6, wide, wide, band, 3, 6, true, false},
		{"zero seeded to its min", 0, 2, Bounds{2, 10}, wide, band, 2, 2, true, false},
		{"numerator lags: raised", 1, 5, wide, wide, band, 3, 5, true, false},
		{"denominator lags: raised", 7, 2, wide, wide, band, 7, 4, true, false},
		{"numerator lags at its max: denominator lowered", 3, 9, Bounds{0, 3}, wide, band, 3, 6, true, false},
		{"denominator lags at its max: numerator lowered", 9, 2, wide, Bounds{0, 3}, band, 6, 3, true, false},
		{"max reached on both sides: infeasible", 1, 9, Bounds{0, 1}, Bounds{5, 10}, band, 1, 5, true, true},
		{"a role's max is zero", 3, 0, wide, Bounds{0, 0}, band, 3, 0, false, true},
		{"inputs clamped to bounds first", 12, 1, wide, wide, band, 10, 5, true, false},
		{"integer band too narrow", 4, 3, wide, wide, Ratio{Min: 1.5, Max: 1.5}, 5, 3, true, true},
		{"exact edges are inside", 1, 2, wide, wide, band, 1, 2, false, false},
		{"upper edge is inside", 4, 2, wide, wide, band, 4, 2, false, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := RepairRatio(c.num, c.den, c.nb, c.db, c.r)
			if got.Num != c.wantN || got.Den != c.wantD || got.Adjusted != c.adjusted || got.Infeasible != c.infeasible {
				t.Fatalf("RepairRatio(%d, %d) = %+v, want %d/%d adjusted=%v infeasible=%v", c.num, c.den, got, c.wantN, c.wantD, c.adjusted, c.infeasible)
			}
		})
	}
}

// TestRepairRatioProperties checks every input on a grid: the result is
// within bounds, within the band unless reported infeasible, repairing it
// again changes nothing (no oscillation from the band itself), and a lagging
// role is raised, never the other lowered, while the lagging one has room.
func TestRepairRatioProperties(t *testing.T) {
	bands := []Ratio{{Min: 0.5, Max: 2}, {Min: 1, Max: 1}, {Min: 0.25, Max: 0.5}, {Min: 1.5, Max: 3}}
	bounds := []Bounds{{0, 8}, {1, 4}, {2, 2}, {0, 1}}
	for _, r := range bands {
		for _, nb := range bounds {
			for _, db := range bounds {
				for n := int32(0); n <= 9; n++ {
					for d := int32(0); d <= 9; d++ {
						name := fmt.Sprintf("%v %v %v %d/%d", r, nb, db, n, d)
						got := RepairRatio(n, d, nb, db, r)
						if got.Num < nb.Min || got.Num > nb.Max || got.Den < db.Min || got.Den > db.Max {
							t.Fatalf("%s: %+v out of bounds", name, got)
						}
						if !got.Infeasible && got.Num+got.Den > 0 {
							q := float64(got.Num) / float64(got.Den)
							if got.Den == 0 || q < r.Min-1e-9 || q > r.Max+1e-9 {
								t.Fatalf("%s: %+v outside the band", name, got)
							}
						}
						again := RepairRatio(got.Num, got.Den, nb, db, r)
						if !got.Infeasible && (again.Num != got.Num || again.Den != got.Den) {
							t.Fatalf("%s: not a fixed point: %+v then %+v", name, got, again)
						}
						cn, cd := clamp(n, nb), clamp(d, db)
						if cn > 0 && cd > 0 && float64(cn)/float64(cd) < r.Min && got.Num < nb.Max && got.Den < cd {
							t.Fatalf("%s: lowered the denominator while the numerator had room: %+v", name, got)
						}
					}
				}
			}
		}
	}
}
