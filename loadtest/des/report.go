package des

import (
	"fmt"
	"io"
	"text/tabwriter"
)

// WriteTable writes the report as an aligned text table.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tthroughput rps\tTTFT mean s\tp50 s\tp90 s\tp99 s\tqueue s\te2e mean s\thit rate\timbalance\tdone\tfailed\tpreempt\twall\t")
	for _, name := range r.Order {
		p, ok := r.Policies[name]
		if !ok {
			continue
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.2f\t%d\t%d\t%d\t%.1fs\t\n",
			name, p.ThroughputRPS, p.TTFTMean, p.TTFTP50, p.TTFTP90, p.TTFTP99, p.QueueMean, p.E2EMean,
			p.PrefixHitRate, p.LoadImbalance, p.Completed, p.Failed, p.Preemptions, p.Wall.Seconds())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, name := range r.Order {
		if p := r.Policies[name]; p.Learned.PrefillRate > 0 {
			fmt.Fprintf(w, "%s learned: prefillRate %.0f tok/s, stepBase %.4fs, decodeSecPerToken %.3g; output length predicted within %.0f%% (mean abs error)\n",
				name, p.Learned.PrefillRate, p.Learned.StepBase, p.Learned.DecodeSecPerToken, 100*p.OutputPredError)
		}
	}
	_, err := fmt.Fprintf(w, "oracle (infinite shared cache) hit rate: %.3f\n", r.OracleHitRate)
	return err
}
