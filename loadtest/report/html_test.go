package report

import (
	"bytes"
	"encoding/xml"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/net/html"
)

// testReport is three policies over four engines; "slow" has a long tail,
// "empty" ran nothing (table only), names need escaping in one case.
func testReport() Report {
	r := Report{Policies: map[string]PolicyResult{}, Runs: map[string]Run{}, Order: []string{"kvmesh", "slow<&>", "empty"}, OracleHitRate: 0.8}
	ids := []string{"engine-0", "engine-1", "engine-2", "engine-3"}
	for k, p := range r.Order[:2] {
		var recs []Record
		for i := range 500 {
			ttft := 0.05 + float64(i%37)*0.01*float64(k+1)
			if k == 1 && i%50 == 0 {
				ttft = 4
			}
			recs = append(recs, Record{Start: float64(i) * 0.02, TTFT: ttft, E2E: ttft + 1 + float64(i%7)*0.1,
				PromptTokens: 2000, CachedTokens: 1000 + 500*k + i, OutputTokens: 64, Engine: i % (4 - k)})
		}
		r.Runs[p] = Run{Records: recs, EngineIDs: ids}
		r.Policies[p] = PolicyResult{ThroughputRPS: 40, TTFTMean: 0.2, PrefixHitRate: 0.6, LoadImbalance: 1.1, Completed: len(recs)}
	}
	r.Policies["empty"] = PolicyResult{}
	return r
}

func writeTestHTML(t *testing.T, r Report) string {
	t.Helper()
	var b bytes.Buffer
	if err := WriteHTML(&b, r, HTMLMeta{Notes: []string{"workload shared-prefix <test>"}}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

// TestHTMLStructure: the page parses as HTML; every policy is in the
// summary table and the legend; each plot is well-formed SVG (XML); every
// policy with records has a curve on each plot; each CDF rises
// monotonically from left to right to 1; nothing is loaded from anywhere.
func TestHTMLStructure(t *testing.T) {
	page := writeTestHTML(t, testReport())
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	var (
		rows    []string // first cell of each summary row
		legend  string
		svgs    = map[string]*html.Node{}
		offends []string
	)
	for n := range doc.Descendants() {
		if n.Type != html.ElementNode {
			continue
		}
		switch n.Data {
		case "script", "link", "img", "iframe", "object", "embed", "image", "use":
			offends = append(offends, "<"+n.Data+">")
		case "tr":
			if td := firstChild(n, "td"); td != nil {
				rows = append(rows, text(td))
			}
		case "p":
			if attr(n, "class") == "legend" {
				legend = text(n)
			}
		case "svg":
			svgs[attr(n, "id")] = n
		}
		for _, a := range n.Attr {
			v := strings.ToLower(strings.TrimSpace(a.Val))
			if a.Key == "src" || a.Key == "href" || a.Key == "xlink:href" || strings.Contains(v, "url(") || strings.Contains(v, "://") {
				offends = append(offends, a.Key+"="+a.Val)
			}
		}
	}
	if len(offends) > 0 || strings.Contains(page, "@import") || strings.Contains(page, "url(") {
		t.Errorf("external references: %v", offends)
	}
	if strings.Join(rows, ",") != "kvmesh,slow<&>,empty" {
		t.Errorf("summary rows %q", rows)
	}
	for _, p := range []string{"kvmesh", "slow<&>", "empty"} {
		if !strings.Contains(legend, p) {
			t.Errorf("legend %q lacks %q", legend, p)
		}
	}
	for _, id := range []string{"ttft-cdf", "tpot-cdf", "throughput", "waiting", "hit-rate", "engine-load"} {
		if svgs[id] == nil {
			t.Errorf("no plot %s", id)
		}
	}
	checkSVGWellFormed(t, page)
	for _, id := range []string{"ttft-cdf", "tpot-cdf", "throughput", "waiting", "hit-rate", "engine-load"} {
		curves := map[string]int{}
		for n := range svgs[id].Descendants() {
			if c := attr(n, "class"); c == "series" || c == "bar" {
				curves[attr(n, "data-policy")]++
			}
		}
		if curves["kvmesh"] == 0 || curves["slow<&>"] == 0 || curves["empty"] != 0 || len(curves) != 2 {
			t.Errorf("%s: curves per policy %v", id, curves)
		}
	}
	for _, id := range []string{"ttft-cdf", "tpot-cdf"} {
		for n := range svgs[id].Descendants() {
			if attr(n, "class") == "series" {
				checkMonotone(t, id+" "+attr(n, "data-policy"), attr(n, "points"))
			}
		}
	}
}

// checkMonotone: SVG x grows rightwards and y downwards, so a CDF's points
// have x and −y never decreasing, and it ends at the top of the plot.
func checkMonotone(t *testing.T, what, points string) {
	t.Helper()
	var px, py = math.Inf(-1), math.Inf(1)
	fields := strings.Fields(points)
	if len(fields) < 10 {
		t.Fatalf("%s: %d points", what, len(fields))
	}
	for _, f := range fields {
		xs, ys, ok := strings.Cut(f, ",")
		x, err1 := strconv.ParseFloat(xs, 64)
		y, err2 := strconv.ParseFloat(ys, 64)
		if !ok || err1 != nil || err2 != nil {
			t.Fatalf("%s: bad point %q", what, f)
		}
		if x < px || y > py {
			t.Fatalf("%s: not monotone at %q after (%v,%v)", what, f, px, py)
		}
		px, py = x, y
	}
	if py != marginT {
		t.Errorf("%s: ends at y %v, want the top %d (fraction 1)", what, py, marginT)
	}
}

// checkSVGWellFormed decodes every <svg>…</svg> of the page as XML: want
// of them (6 when none is given).
func checkSVGWellFormed(t *testing.T, page string, want ...int) {
	t.Helper()
	n := 0
	for rest := page; ; n++ {
		i := strings.Index(rest, "<svg")
		if i < 0 {
			break
		}
		j := strings.Index(rest[i:], "</svg>")
		if j < 0 {
			t.Fatal("unclosed <svg>")
		}
		frag := rest[i : i+j+len("</svg>")]
		d := xml.NewDecoder(strings.NewReader(frag))
		for {
			if _, err := d.Token(); err == io.EOF {
				break
			} else if err != nil {
				t.Fatalf("svg %d not well-formed: %v\n%s", n, err, frag[:min(len(frag), 300)])
			}
		}
		rest = rest[i+j:]
	}
	if w := append(want, 6)[0]; n != w {
		t.Errorf("%d svg elements, want %d", n, w)
	}
}

// TestHTMLNoData: a report with no records still renders every plot
// (saying so) and the table.
func TestHTMLNoData(t *testing.T) {
	r := Report{Policies: map[string]PolicyResult{"random": {}}}
	page := writeTestHTML(t, r)
	if strings.Count(page, "no data") != 6 || !strings.Contains(page, "<td>random</td>") {
		t.Fatal(page)
	}
	checkSVGWellFormed(t, page)
}

func TestBin(t *testing.T) {
	recs := []Record{
		{Start: 0, TTFT: 3, E2E: 4, PromptTokens: 10, CachedTokens: 5},
		{Start: 1, TTFT: 0.2, E2E: 1.5, PromptTokens: 10, CachedTokens: 10},
		{Start: 5, TTFT: 1, E2E: 2, PromptTokens: 10},
	}
	s := Bin(recs, 10, 5) // bins of 2 s
	want := Series{BinWidth: 2, Throughput: []float64{0, 0.5, 0.5, 0.5, 0}, Waiting: []float64{1.1, 0.5, 0.5, 0, 0},
		HitRate: []float64{0.75, math.NaN(), 0, math.NaN(), math.NaN()}}
	if got, w := fmt.Sprint(s), fmt.Sprint(want); got != w {
		t.Fatalf("Bin = %s\nwant %s", got, w)
	}
	if got := PerEngine([]Record{{Engine: 1}, {Engine: 1}, {Engine: -1}, {Engine: 7}}, 2); fmt.Sprint(got) != "[0 2]" {
		t.Fatalf("PerEngine = %v", got)
	}
}

func TestCDF(t *testing.T) {
	for _, n := range []int{1, 7, 200, 201, 1000} {
		v := make([]float64, n)
		for i := range v {
			v[i] = float64(i)
		}
		xs, ys := cdf(v, 2)
		if len(xs) != min(n, 200) || ys[len(ys)-1] != 1 || xs[len(xs)-1] != 2*float64(n-1) {
			t.Fatalf("n %d: %d points, last (%v, %v)", n, len(xs), xs[len(xs)-1], ys[len(ys)-1])
		}
	}
}

func attr(n *html.Node, key string) string {
	for _, a := range n.Attr {
		if a.Key == key {
			return a.Val
		}
	}
	return ""
}

func firstChild(n *html.Node, tag string) *html.Node {
	for c := n.FirstChild; c != nil; c = c.NextSibling {
		if c.Type == html.ElementNode && c.Data == tag {
			return c
		}
	}
	return nil
}

func text(n *html.Node) string {
	var b strings.Builder
	for d := range n.Descendants() {
		if d.Type == html.TextNode {
			b.WriteString(d.Data)
		}
	}
	return b.String()
}

// TestChartsHTML: WriteChartsHTML's page is well-formed, nothing loaded from
// anywhere; the table's cells are escaped; each chart has one line per
// series in its name's legend colour (unknown names grey); a NaN point is
// left out of its line, which still joins its neighbours.
func TestChartsHTML(t *testing.T) {
	names := []string{"static", "slo <P 1.1>"}
	charts := []Chart{
		{ID: "engines", Title: "Engines", XLabel: "min", YLabel: "n", Lines: []ChartLine{
			{Name: "static", X: []float64{1, 2, 3}, Y: []float64{3, 3, 3}},
			{Name: "slo <P 1.1>", X: []float64{1, 2, 3}, Y: []float64{1, 2, 4}},
		}},
		{ID: "attainment", Title: "Attainment", Lines: []ChartLine{
			{Name: "slo <P 1.1>", X: []float64{1, 2, 3, 4}, Y: []float64{1, math.NaN(), 0.5, 0.9}},
			{Name: "other", X: []float64{1, 2}, Y: []float64{0.2, 0.3}},
		}},
	}
	var b bytes.Buffer
	err := WriteChartsHTML(&b, HTMLMeta{Title: "t"}, names, []string{"run", "GPU-h"},
		[][]string{{"static", "5.02"}, {"slo <P 1.1>", "3.35"}}, charts)
	if err != nil {
		t.Fatal(err)
	}
	page := b.String()
	checkSVGWellFormed(t, page, 2)
	if strings.Contains(page, "<P 1.1>") || !strings.Contains(page, "<td>slo &lt;P 1.1&gt;</td><td>3.35</td>") {
		t.Errorf("table cells not escaped as text:\n%s", page)
	}
	doc, err := html.Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	lines := map[string][]*html.Node{}
	for n := range doc.Descendants() {
		if n.Type == html.ElementNode && n.Data == "script" {
			t.Errorf("a script")
		}
		if attr(n, "class") == "series" {
			lines[attr(n.Parent, "id")] = append(lines[attr(n.Parent, "id")], n)
		}
	}
	if len(lines["engines"]) != 2 || len(lines["attainment"]) != 2 {
		t.Fatalf("lines per chart: %d, %d", len(lines["engines"]), len(lines["attainment"]))
	}
	for _, n := range append(lines["engines"], lines["attainment"]...) {
		want := map[string]string{"static": color(0), "slo <P 1.1>": color(1), "other": "#555"}[attr(n, "data-policy")]
		if got := attr(n, "stroke"); got != want {
			t.Errorf("%s: stroke %s, want %s", attr(n, "data-policy"), got, want)
		}
		if attr(n, "data-policy") == "slo <P 1.1>" && attr(n.Parent, "id") == "attainment" {
			if pts := strings.Fields(attr(n, "points")); len(pts) != 3 {
				t.Errorf("attainment line points %q, want the 3 finite ones", pts)
			}
		}
	}
}
