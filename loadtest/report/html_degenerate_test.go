package report

import (
	"math"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// TestHTMLDegenerateSeries: plots of series with one point, all values
// equal, all zero, or no values draw no NaN or Inf anywhere (a range of
// zero width made the x step log10(0): points="NaN,132.0 NaN,24.0" and a
// NaN tick label), and every coordinate is inside the plot.
func TestHTMLDegenerateSeries(t *testing.T) {
	ids := []string{"e0", "e1"}
	one := []Record{{Start: 0.5, TTFT: 0.109, E2E: 0.326, PromptTokens: 1000, CachedTokens: 0, OutputTokens: 10}}
	// Two identical requests of one output token: every TTFT equal, every
	// TPOT 0, both started in one bin (one hit-rate point).
	same := []Record{
		{Start: 1, TTFT: 0.2, E2E: 0.2, PromptTokens: 100, CachedTokens: 50, OutputTokens: 1, Engine: 1},
		{Start: 1, TTFT: 0.2, E2E: 0.2, PromptTokens: 100, CachedTokens: 50, OutputTokens: 1, Engine: 1},
	}
	// Everything zero: no time span at all.
	zero := []Record{{PromptTokens: 1, OutputTokens: 1}, {PromptTokens: 1, OutputTokens: 1}}
	// Not finite: a record the plots must leave out, not draw.
	odd := []Record{{Start: 1, TTFT: math.NaN(), E2E: math.Inf(1), PromptTokens: 1, OutputTokens: 3}, one[0]}
	for name, runs := range map[string]map[string]Run{
		"one point": {"a": {Records: one, EngineIDs: ids}},
		"all equal": {"a": {Records: same, EngineIDs: ids}, "b": {Records: same, EngineIDs: ids}},
		"all zero":  {"a": {Records: zero, EngineIDs: ids}},
		"empty":     {"a": {EngineIDs: ids}, "b": {}},
		"mixed":     {"a": {Records: one, EngineIDs: ids}, "b": {Records: same}, "c": {Records: zero, EngineIDs: ids}},
		"no engine": {"a": {Records: one}},
		"odd":       {"a": {Records: odd, EngineIDs: ids}},
	} {
		r := Report{Policies: map[string]PolicyResult{}, Runs: runs}
		for p := range runs {
			r.Order = append(r.Order, p)
			r.Policies[p] = PolicyResult{Completed: len(runs[p].Records)}
		}
		page := writeTestHTML(t, r)
		checkPlotsFinite(t, name, page)
		// One request: its TTFT CDF is one point, drawn as a dot (a
		// polyline of one point drew nothing: an empty plot beside a
		// table with a value).
		if ttft := page[strings.Index(page, `<svg id="ttft-cdf"`):]; name == "one point" &&
			!strings.Contains(ttft[:strings.Index(ttft, "</svg>")], `<circle class="point" data-policy="a"`) {
			t.Errorf("%s: the TTFT CDF draws no dot:\n%s", name, ttft[:strings.Index(ttft, "</svg>")])
		}
	}
}

// checkPlotsFinite fails when any attribute or text of an <svg> on page
// holds NaN or Inf, or a coordinate lies outside the plot.
func checkPlotsFinite(t *testing.T, name, page string) {
	t.Helper()
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	plots := 0
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode || n.Data != "svg" {
			continue
		}
		plots++
		for m := range n.Descendants() {
			if m.Type == html.TextNode {
				if s := strings.ToLower(m.Data); strings.Contains(s, "nan") || strings.Contains(s, "inf") {
					t.Errorf("%s: plot %s: text %q", name, attr(n, "id"), m.Data)
				}
				continue
			}
			for _, a := range m.Attr {
				if a.Key == "data-policy" || a.Key == "id" {
					continue
				}
				if s := strings.ToLower(a.Val); strings.Contains(s, "nan") || strings.Contains(s, "inf") {
					t.Errorf("%s: plot %s: <%s %s=%q>", name, attr(n, "id"), m.Data, a.Key, a.Val)
				}
				if attr(m, "transform") != "" {
					continue // the rotated axis label
				}
				switch a.Key {
				case "points":
					for _, pt := range strings.Fields(a.Val) {
						xy := strings.Split(pt, ",")
						if len(xy) != 2 {
							t.Errorf("%s: plot %s: point %q", name, attr(n, "id"), pt)
							continue
						}
						inPlot(t, name, attr(n, "id"), "x", xy[0], plotW)
						inPlot(t, name, attr(n, "id"), "y", xy[1], plotH)
					}
				case "x", "x1", "x2", "width", "cx":
					inPlot(t, name, attr(n, "id"), a.Key, a.Val, plotW)
				case "y", "y1", "y2", "height", "cy":
					inPlot(t, name, attr(n, "id"), a.Key, a.Val, plotH)
				}
			}
		}
	}
	if plots != 6 {
		t.Errorf("%s: %d plots, want 6", name, plots)
	}
}

func inPlot(t *testing.T, name, plot, key, v string, size float64) {
	t.Helper()
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f < 0 || f > size {
		t.Errorf("%s: plot %s: %s=%q outside 0..%v", name, plot, key, v, size)
	}
}

// TestPlotBoundsDegenerate: the x range of a plot whose values are all
// equal is widened to a sensible axis: from 0 to a round value at or past
// the value (from 0 to 1 when it is 0), not a NaN or a range starting at
// the value.
func TestPlotBoundsDegenerate(t *testing.T) {
	for _, v := range []float64{0.109, 5, 0, 1e-9, 3e5, -2} {
		p := plot{lines: []line{{xs: []float64{v, v}, ys: []float64{0.5, 1}}}}
		x0, x1, y0, y1 := p.bounds()
		lo, hi := min(v, 0), max(v, 0)
		if v == 0 {
			hi = 1
		}
		if x0 != lo || x1 < hi || x1 > hi+math.Abs(v) || y0 != 0 || y1 != 1 {
			t.Errorf("all %v: x %v..%v, y %v..%v; want x from %v to a round value in [%v, %v], y 0..1", v, x0, x1, y0, y1, lo, hi, hi+math.Abs(v))
		}
		for _, tk := range ticks(x0, x1) {
			if !isFinite(tk) {
				t.Errorf("all %v: tick %v", v, tk)
			}
		}
	}
}

// TestNiceStepDegenerate: a step for a width that is not a positive
// finite number is 1, never NaN, Inf or 0 (log10(0) made every tick NaN).
func TestNiceStepDegenerate(t *testing.T) {
	for _, d := range []float64{0, -1, math.NaN(), math.Inf(1), math.Inf(-1)} {
		if s := niceStep(d); s != 1 {
			t.Errorf("niceStep(%v) = %v, want 1", d, s)
		}
	}
	if s := niceStep(5e-324); !(s >= 5e-324) || !isFinite(s) {
		t.Errorf("niceStep(5e-324) = %v, want a finite step at least as wide", s)
	}
	for d, want := range map[float64]float64{0.03: 0.05, 1: 1, 1.2: 2, 7: 10, 3e5: 5e5} {
		if s := niceStep(d); math.Abs(s-want) > 1e-12*want {
			t.Errorf("niceStep(%v) = %v, want %v", d, s, want)
		}
	}
}

// TestTicksHuge: a range wider than a float64 holds (its step is then 1,
// too small to move a tick) gives a bounded list of ticks, not a loop.
func TestTicksHuge(t *testing.T) {
	if n := len(ticks(-math.MaxFloat64, math.MaxFloat64)); n == 0 || n > 50 {
		t.Errorf("%d ticks", n)
	}
	if got := ticks(0, 1); len(got) != 6 || got[5] != 1 {
		t.Errorf("ticks 0..1: %v", got)
	}
}
