package report

import (
	"fmt"
	"html"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
	"time"
)

// HTMLMeta describes the page around a report.
type HTMLMeta struct {
	// Title heads the page. Default "kvmesh benchmark".
	Title string
	// Notes are lines under the title (workload, mode, command line).
	Notes []string
	// Bins is the number of time bins of the over-time plots. Default:
	// about 8 completions per bin, 10 to 60 bins.
	Bins int
	// Generated stamps the page; zero leaves it out (tests compare pages).
	Generated time.Time
}

// WriteHTML writes r as one self-contained HTML page: a summary table and
// inline SVG plots (TTFT and TPOT CDFs per policy; throughput, requests
// waiting for their first token and prefix hit rate over time; requests per
// engine). It loads nothing: no scripts, stylesheets, fonts or images from
// anywhere, so the file can be mailed or attached to a CI run as it is.
// Policies without records (r.Runs) appear in the table only.
//
// The plots are drawn here rather than with a charting library: the Go
// ones either emit PNG (not inline, not text-diffable) or pull in a large
// dependency tree for five line charts and a bar chart.
func WriteHTML(w io.Writer, r Report, m HTMLMeta) error {
	if m.Title == "" {
		m.Title = "kvmesh benchmark"
	}
	if m.Bins <= 0 {
		m.Bins = defaultBins(r)
	}
	names := r.policies()
	return writePage(w, m, names, func(b *strings.Builder) { writeSummary(b, r, names) }, r.plots(names, m.Bins))
}

// writePage writes the page around a table (summary) and plots: title,
// notes, the legend of names.
func writePage(w io.Writer, m HTMLMeta, names []string, summary func(*strings.Builder), plots []plot) error {
	var b strings.Builder
	b.WriteString("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>")
	b.WriteString(html.EscapeString(m.Title))
	b.WriteString("</title>\n<style>" + pageCSS + "</style>\n</head>\n<body>\n<h1>")
	b.WriteString(html.EscapeString(m.Title))
	b.WriteString("</h1>\n")
	for _, n := range m.Notes {
		fmt.Fprintf(&b, "<p class=\"note\">%s</p>\n", html.EscapeString(n))
	}
	if !m.Generated.IsZero() {
		fmt.Fprintf(&b, "<p class=\"note\">generated %s</p>\n", html.EscapeString(m.Generated.UTC().Format(time.RFC3339)))
	}
	writeLegend(&b, names)
	summary(&b)
	b.WriteString("<div class=\"plots\">\n")
	for _, p := range plots {
		p.svg(&b)
	}
	b.WriteString("</div>\n</body>\n</html>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// Chart is one line chart of WriteChartsHTML.
type Chart struct {
	// ID is the <svg> element's id; Title heads it.
	ID, Title, XLabel, YLabel string
	Lines                     []ChartLine
}

// ChartLine is one run's series on a Chart: Name is one of
// WriteChartsHTML's names (its colour), X and Y its points.
type ChartLine struct {
	Name string
	X, Y []float64
}

// WriteChartsHTML writes one self-contained page as WriteHTML does, for
// results that are not per-request records (the autoscaling benchmark's
// windows): a table (header and rows, every cell escaped) and line charts,
// names in the legend coloured in order.
func WriteChartsHTML(w io.Writer, m HTMLMeta, names, header []string, rows [][]string, charts []Chart) error {
	if m.Title == "" {
		m.Title = "kvmesh benchmark"
	}
	plots := make([]plot, 0, len(charts))
	for _, c := range charts {
		p := plot{id: c.ID, title: c.Title, xlabel: c.XLabel, ylabel: c.YLabel}
		for _, l := range c.Lines {
			col := "#555"
			if i := slices.Index(names, l.Name); i >= 0 {
				col = color(i)
			}
			n := min(len(l.X), len(l.Y))
			p.lines = append(p.lines, line{policy: l.Name, color: col, xs: l.X[:n], ys: l.Y[:n]})
		}
		plots = append(plots, p)
	}
	return writePage(w, m, names, func(b *strings.Builder) {
		b.WriteString("<table class=\"summary\">\n<tr>")
		for _, h := range header {
			fmt.Fprintf(b, "<th>%s</th>", html.EscapeString(h))
		}
		b.WriteString("</tr>\n")
		for _, r := range rows {
			b.WriteString("<tr>")
			for _, c := range r {
				fmt.Fprintf(b, "<td>%s</td>", html.EscapeString(c))
			}
			b.WriteString("</tr>\n")
		}
		b.WriteString("</table>\n")
	}, plots)
}

// defaultBins is about 8 completions per bin of the smallest run, within
// 10..60 bins: fewer bins than that draw noise.
func defaultBins(r Report) int {
	n := -1
	for _, run := range r.Runs {
		if len(run.Records) > 0 && (n < 0 || len(run.Records) < n) {
			n = len(run.Records)
		}
	}
	return min(max(n/8, 10), 60)
}

const pageCSS = `body{font-family:system-ui,sans-serif;margin:2em;color:#222}h1{font-size:1.4em}
.note{color:#555;margin:.2em 0;font-family:monospace}table{border-collapse:collapse;margin:1em 0}
td,th{padding:.25em .6em;border-bottom:1px solid #ddd;text-align:right}td:first-child,th:first-child{text-align:left}
.plots{display:flex;flex-wrap:wrap;gap:1em}.legend span{display:inline-block;margin-right:1.2em}
.legend i{display:inline-block;width:1.2em;height:.6em;margin-right:.3em}svg text{font-size:11px;fill:#333}`

// palette colours policies in order (colour-blind-safe Tableau 10).
var palette = []string{"#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7", "#9c755f", "#bab0ac"}

func color(i int) string { return palette[i%len(palette)] }

// policies is r.Order, or r.Policies' names sorted when no order is set.
func (r Report) policies() []string {
	if len(r.Order) > 0 {
		return slices.DeleteFunc(slices.Clone(r.Order), func(p string) bool { _, ok := r.Policies[p]; return !ok })
	}
	names := make([]string, 0, len(r.Policies))
	for p := range r.Policies {
		names = append(names, p)
	}
	slices.Sort(names)
	return names
}

func writeLegend(b *strings.Builder, names []string) {
	b.WriteString("<p class=\"legend\">")
	for i, p := range names {
		fmt.Fprintf(b, "<span><i style=\"background:%s\"></i>%s</span>", color(i), html.EscapeString(p))
	}
	b.WriteString("</p>\n")
}

func writeSummary(b *strings.Builder, r Report, names []string) {
	b.WriteString("<table class=\"summary\">\n<tr><th>policy</th><th>throughput req/s</th><th>TTFT mean s</th><th>p50 s</th><th>p90 s</th>" +
		"<th>p99 s</th><th>TPOT mean ms</th><th>TPOT p99 ms</th><th>E2E mean s</th><th>hit rate</th><th>imbalance</th><th>done</th><th>failed</th></tr>\n")
	for _, p := range names {
		res := r.Policies[p]
		tpot := TPOTs(r.Runs[p].Records)
		done := res.Completed > 0
		fmt.Fprintf(b, "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%d</td><td>%d</td></tr>\n",
			html.EscapeString(p), cell(done, "%.2f", res.ThroughputRPS), cell(done, "%.3f", res.TTFTMean), cell(done, "%.3f", res.TTFTP50),
			cell(done, "%.3f", res.TTFTP90), cell(done, "%.3f", res.TTFTP99), cell(done && len(tpot) > 0, "%.1f", 1000*meanOf(tpot)),
			cell(done && len(tpot) > 0, "%.1f", 1000*Quantile(tpot, 0.99)), cell(done, "%.3f", res.E2EMean), cell(res.hitDefined(), "%.3f", res.PrefixHitRate),
			cell(res.imbalanceDefined(), "%.2f", res.LoadImbalance), res.Completed, res.Failed)
	}
	b.WriteString("</table>\n")
	if n := r.fewerThanEngines(names); n != "" {
		fmt.Fprintf(b, "<p class=\"note\">imbalance n/a (%s): fewer requests completed than there are engines</p>\n", html.EscapeString(n))
	}
	if o := r.offered(names); o != "" {
		fmt.Fprintf(b, "<p class=\"note\">%s</p>\n", html.EscapeString(o))
	}
	if r.OracleHitRate > 0 {
		fmt.Fprintf(b, "<p class=\"note\">oracle (one infinite shared cache) hit rate: %.3f</p>\n", r.OracleHitRate)
	}
}

func sortedValues(recs []Record, f func(Record) float64) []float64 {
	v := make([]float64, len(recs))
	for i, r := range recs {
		v[i] = f(r)
	}
	slices.Sort(v)
	return v
}

func meanOf(v []float64) float64 {
	if len(v) == 0 {
		return 0
	}
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// line is one policy's curve on a plot.
type line struct {
	policy string
	color  string
	xs, ys []float64
}

// plot is one SVG chart: lines, or grouped bars when bars is set.
type plot struct {
	id, title, xlabel, ylabel string
	lines                     []line
	bars                      bool
}

// plots builds the report's charts from its runs.
func (r Report) plots(names []string, bins int) []plot {
	ttft := plot{id: "ttft-cdf", title: "TTFT CDF", xlabel: "TTFT (s)", ylabel: "fraction of requests"}
	tpot := plot{id: "tpot-cdf", title: "TPOT CDF", xlabel: "time per output token (ms)", ylabel: "fraction of requests"}
	thr := plot{id: "throughput", title: "Throughput over time", xlabel: "time (s)", ylabel: "requests completed / s"}
	wait := plot{id: "waiting", title: "Queue over time", xlabel: "time (s)", ylabel: "requests waiting for first token"}
	hit := plot{id: "hit-rate", title: "Prefix hit rate over time", xlabel: "time (s)", ylabel: "cached / prompt tokens"}
	load := plot{id: "engine-load", title: "Per-engine load", xlabel: "engine", ylabel: "requests completed", bars: true}
	end := 0.0
	for _, p := range names {
		end = max(end, End(r.Runs[p].Records))
	}
	for i, p := range names {
		run := r.Runs[p]
		if len(run.Records) == 0 {
			continue
		}
		c := color(i)
		xs, ys := cdf(sortedValues(run.Records, func(r Record) float64 { return r.TTFT }), 1)
		ttft.lines = append(ttft.lines, line{p, c, xs, ys})
		xs, ys = cdf(TPOTs(run.Records), 1000)
		tpot.lines = append(tpot.lines, line{p, c, xs, ys})
		s := Bin(run.Records, end, bins)
		mids := make([]float64, len(s.Throughput)) // none when the records span no time
		for j := range mids {
			mids[j] = (float64(j) + 0.5) * s.BinWidth
		}
		thr.lines = append(thr.lines, line{p, c, mids, s.Throughput})
		wait.lines = append(wait.lines, line{p, c, mids, s.Waiting})
		hit.lines = append(hit.lines, line{p, c, mids, s.HitRate})
		per := PerEngine(run.Records, len(run.EngineIDs))
		ex, ey := make([]float64, len(per)), make([]float64, len(per))
		for j, n := range per {
			ex[j], ey[j] = float64(j), float64(n)
		}
		load.lines = append(load.lines, line{p, c, ex, ey})
	}
	return []plot{ttft, tpot, thr, wait, hit, load}
}

// cdf returns at most cdfPoints points (x, fraction ≤ x) of sorted v, x
// multiplied by scale; both coordinates never decrease.
func cdf(v []float64, scale float64) (xs, ys []float64) {
	const cdfPoints = 200
	n := len(v)
	if n == 0 {
		return nil, nil
	}
	k := min(n, cdfPoints)
	for j := 1; j <= k; j++ {
		i := (j*n+k-1)/k - 1 // the last index of the j-th of k equal slices
		xs = append(xs, v[i]*scale)
		ys = append(ys, float64(i+1)/float64(n))
	}
	return xs, ys
}

// Chart geometry, in SVG user units.
const (
	plotW, plotH             = 460, 280
	marginL, marginR         = 56, 12
	marginT, marginB         = 24, 40
	innerW, innerH           = plotW - marginL - marginR, plotH - marginT - marginB
	maxBars                  = 240
	noData           float64 = -1
)

// svg writes p as an inline <svg> element (well-formed XML: every element
// closed, every text escaped).
func (p plot) svg(b *strings.Builder) {
	fmt.Fprintf(b, "<svg id=\"%s\" class=\"plot\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" role=\"img\">\n", p.id, plotW, plotH, plotW, plotH)
	fmt.Fprintf(b, "<title>%s</title>\n", html.EscapeString(p.title))
	fmt.Fprintf(b, "<text x=\"%d\" y=\"15\" font-weight=\"bold\">%s</text>\n", marginL, html.EscapeString(p.title))
	x0, x1, y0, y1 := p.bounds()
	if x1 == noData {
		fmt.Fprintf(b, "<text x=\"%d\" y=\"%d\">no data</text>\n</svg>\n", marginL+10, marginT+innerH/2)
		return
	}
	sx := func(x float64) float64 { return marginL + (x-x0)/(x1-x0)*innerW }
	sy := func(y float64) float64 { return marginT + innerH - (y-y0)/(y1-y0)*innerH }
	p.axes(b, x0, x1, y0, y1, sx, sy)
	if p.bars {
		p.drawBars(b, sx, sy, x0, x1)
	} else {
		for _, l := range p.lines {
			fmt.Fprintf(b, "<polyline class=\"series\" data-policy=\"%s\" fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" points=\"",
				html.EscapeString(l.policy), l.color)
			pts, last := 0, 0
			for i := range l.xs {
				if !isFinite(l.xs[i]) || !isFinite(l.ys[i]) {
					continue // an empty bin: the line joins its neighbours
				}
				if i > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(num(sx(l.xs[i])) + "," + num(sy(l.ys[i])))
				pts, last = pts+1, i
			}
			b.WriteString("\"/>\n")
			if pts == 1 { // a line of one point draws nothing: a dot does (one request's CDF)
				fmt.Fprintf(b, "<circle class=\"point\" data-policy=\"%s\" cx=\"%s\" cy=\"%s\" r=\"3\" fill=\"%s\"/>\n",
					html.EscapeString(l.policy), num(sx(l.xs[last])), num(sy(l.ys[last])), l.color)
			}
		}
	}
	b.WriteString("</svg>\n")
}

// bounds are the data's ranges (y from 0; bars get half a slot either side).
func (p plot) bounds() (x0, x1, y0, y1 float64) {
	x0, x1, y1 = math.Inf(1), math.Inf(-1), 0
	for _, l := range p.lines {
		for i, x := range l.xs {
			if !isFinite(x) || !isFinite(l.ys[i]) {
				continue
			}
			x0, x1, y1 = min(x0, x), max(x1, x), max(y1, l.ys[i])
		}
	}
	if math.IsInf(x0, 1) {
		return 0, noData, 0, 0
	}
	if p.bars {
		x0, x1 = x0-0.5, x1+0.5
	} else if x0 == x1 {
		// One point, or every value equal (one request; two alike): an
		// empty range, whose step was log10(0) and every coordinate NaN.
		// The axis runs from 0 to a round value at or past the point.
		switch {
		case x0 > 0:
			x0, x1 = 0, niceCeil(x0)
		case x0 < 0:
			x0, x1 = -niceCeil(-x0), 0
		default:
			x1 = 1
		}
	} else if x0 < 0.3*x1 {
		x0 = min(x0, 0) // latencies and times from 0, unless the data sits far from it
	} else {
		st := niceStep((x1 - x0) / 5)
		x0 = math.Floor(x0/st) * st
	}
	if x1 <= x0 {
		x1 = x0 + 1
	}
	if y1 <= 0 {
		y1 = 1
	}
	return x0, x1, 0, niceCeil(y1)
}

func (p plot) axes(b *strings.Builder, x0, x1, y0, y1 float64, sx, sy func(float64) float64) {
	fmt.Fprintf(b, "<g class=\"axes\" stroke=\"#999\" stroke-width=\"1\"><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/><line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\"/></g>\n",
		marginL, marginT, marginL, marginT+innerH, marginL, marginT+innerH, marginL+innerW, marginT+innerH)
	for _, t := range ticks(y0, y1) {
		y := num(sy(t))
		fmt.Fprintf(b, "<line x1=\"%d\" y1=\"%s\" x2=\"%d\" y2=\"%s\" stroke=\"#eee\"/><text x=\"%d\" y=\"%s\" text-anchor=\"end\" dy=\"3\">%s</text>\n",
			marginL, y, marginL+innerW, y, marginL-4, y, label(t))
	}
	xt := ticks(x0, x1)
	if p.bars {
		xt = xt[:0]
		step := max(1, int(math.Ceil((x1-x0)/10)))
		for x := math.Ceil(x0); x <= x1; x += float64(step) {
			xt = append(xt, x)
		}
	}
	for _, t := range xt {
		if t < x0 || t > x1 {
			continue
		}
		fmt.Fprintf(b, "<text x=\"%s\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", num(sx(t)), marginT+innerH+14, label(t))
	}
	fmt.Fprintf(b, "<text x=\"%d\" y=\"%d\" text-anchor=\"middle\">%s</text>\n", marginL+innerW/2, plotH-6, html.EscapeString(p.xlabel))
	fmt.Fprintf(b, "<text transform=\"rotate(-90)\" x=\"%d\" y=\"12\" text-anchor=\"middle\">%s</text>\n", -(marginT + innerH/2), html.EscapeString(p.ylabel))
}

// drawBars draws one group of bars per engine, one bar per policy; with
// more bars than fit it draws each policy's per-engine counts as a line.
func (p plot) drawBars(b *strings.Builder, sx, sy func(float64) float64, x0, x1 float64) {
	n := len(p.lines)
	slot := (sx(x1) - sx(x0)) / (x1 - x0) // one engine's width
	if n == 0 || float64(n)*(x1-x0) > maxBars {
		for _, l := range p.lines {
			fmt.Fprintf(b, "<polyline class=\"series\" data-policy=\"%s\" fill=\"none\" stroke=\"%s\" points=\"", html.EscapeString(l.policy), l.color)
			for i := range l.xs {
				if i > 0 {
					b.WriteByte(' ')
				}
				b.WriteString(num(sx(l.xs[i])) + "," + num(sy(l.ys[i])))
			}
			b.WriteString("\"/>\n")
		}
		return
	}
	w := 0.8 * slot / float64(n)
	for k, l := range p.lines {
		for i, x := range l.xs {
			left := sx(x) - 0.4*slot + float64(k)*w
			top := sy(l.ys[i])
			fmt.Fprintf(b, "<rect class=\"bar\" data-policy=\"%s\" x=\"%s\" y=\"%s\" width=\"%s\" height=\"%s\" fill=\"%s\"/>\n",
				html.EscapeString(l.policy), num(left), num(top), num(w), num(sy(0)-top), l.color)
		}
	}
}

// ticks are about five round values covering [lo, hi].
func ticks(lo, hi float64) []float64 {
	if !(hi > lo) {
		return []float64{lo}
	}
	step := niceStep((hi - lo) / 5)
	var out []float64
	// At most a few dozen: a step too small to move t (a range wider than
	// float64 holds, whose step niceStep makes 1) must not loop forever.
	for t := math.Ceil(lo/step) * step; t <= hi+step*1e-9 && len(out) < 50; t += step {
		out = append(out, t)
	}
	return out
}

// niceStep is the 1, 2 or 5 × 10^k nearest above d; 1 for a d that is
// not a positive finite number (whose log would make every tick NaN).
func niceStep(d float64) float64 {
	if !(d > 0) || math.IsInf(d, 0) {
		return 1
	}
	p := math.Pow(10, math.Floor(math.Log10(d)))
	for _, m := range []float64{1, 2, 5, 10} {
		if m*p >= d {
			return m * p
		}
	}
	return 10 * p
}

// niceCeil rounds v up to a multiple of a nice step (an axis top).
func niceCeil(v float64) float64 {
	s := niceStep(v / 5)
	return math.Ceil(v/s) * s
}

func num(v float64) string { return strconv.FormatFloat(v, 'f', 1, 64) }

func label(v float64) string {
	if v == 0 {
		return "0"
	}
	return strconv.FormatFloat(v, 'g', 4, 64)
}

func isFinite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }
