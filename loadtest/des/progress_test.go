package des

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// steppedClock is a wall clock that advances by step at every reading:
// every progress check is past the next report time, whatever the host's
// speed.
func steppedClock(step time.Duration) func() time.Time {
	var n atomic.Int64
	t0 := time.Unix(0, 0)
	return func() time.Time { return t0.Add(time.Duration(n.Add(1)) * step) }
}

// TestProgressLines: with a writer, each running policy reports a plain
// line at every check once ProgressEvery of wall time has passed (here at
// every one: the clock steps 11 s per reading), and a last one when done;
// the results are those of a run without progress.
func TestProgressLines(t *testing.T) {
	cfg, reqs := smallConfig()
	pols := []string{"random", "kvmesh"}
	quiet, err := Run(context.Background(), cfg, reqs, pols)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	cfg.Progress, cfg.progressClock = &buf, steppedClock(11*time.Second)
	rep, err := Run(context.Background(), cfg, reqs, pols)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pols {
		a, b := quiet.Policies[p], rep.Policies[p]
		a.Wall, b.Wall = 0, 0
		if !reflect.DeepEqual(a, b) || !reflect.DeepEqual(quiet.Runs[p], rep.Runs[p]) {
			t.Errorf("%s: progress changed the result:\n%+v\n%+v", p, a, b)
		}
	}
	n := strconv.Itoa(len(reqs))
	span := fmt.Sprintf("%.1f", reqs[len(reqs)-1].Arrival.Seconds())
	line := regexp.MustCompile(`^des (random|kvmesh): (finished: )?virtual [0-9]+\.[0-9]s \(arrivals span ([0-9.]+)s\), ([0-9]+)/([0-9]+) requests done, [0-9hms]+ wall$`)
	ticks, finished := map[string]int{}, map[string]string{}
	for _, l := range strings.Split(strings.TrimSuffix(buf.String(), "\n"), "\n") {
		m := line.FindStringSubmatch(l)
		if m == nil || m[3] != span || m[5] != n {
			t.Fatalf("line %q: want the form %v, span %ss, %s requests", l, line, span, n)
		}
		if finished[m[1]] != "" {
			t.Errorf("%q after the last line", l)
		}
		if m[2] != "" {
			finished[m[1]] = l
			if m[4] != n {
				t.Errorf("last line %q: not every request done", l)
			}
			continue
		}
		ticks[m[1]]++
	}
	for _, p := range pols {
		if ticks[p] < 1 || finished[p] == "" {
			t.Errorf("%s: %d progress lines, last %q:\n%s", p, ticks[p], finished[p], buf.String())
		}
	}

	// A run that ends before the first report time writes nothing.
	buf.Reset()
	cfg.progressClock = steppedClock(time.Millisecond)
	if _, err := Run(context.Background(), cfg, reqs, pols); err != nil || buf.Len() != 0 {
		t.Fatalf("err %v, progress %q", err, buf.String())
	}
}

// TestProgressPDAndScale: P/D runs report under their policy's name,
// autoscaling runs under their autoscaler's, with the results of runs
// without progress.
func TestProgressPDAndScale(t *testing.T) {
	reqs := smallTrace(t, 1)
	sc := smallScaleConfig(1, 1)
	quiet, err := RunScale(context.Background(), sc, reqs, Static{})
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	sc.Progress, sc.progressClock = &buf, steppedClock(11*time.Second)
	if _, err := RunPD(context.Background(), sc.PDConfig, reqs, []string{"kvmesh-always"}); err != nil {
		t.Fatal(err)
	}
	res, err := RunScale(context.Background(), sc, reqs, Static{})
	if err != nil {
		t.Fatal(err)
	}
	if quiet.Wall, res.Wall = 0, 0; !reflect.DeepEqual(quiet, res) {
		t.Errorf("progress changed the autoscaling run:\n%+v\n%+v", quiet, res)
	}
	n := strconv.Itoa(len(reqs))
	for _, want := range []string{"des kvmesh-always: virtual ", "des kvmesh-always: finished: virtual ", "des static: virtual ",
		"des static: finished: virtual "} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("no line %q...:\n%s", want, buf.String())
		}
	}
	if !strings.Contains(buf.String(), n+"/"+n+" requests done") {
		t.Errorf("no line with every request done:\n%s", buf.String())
	}
}
