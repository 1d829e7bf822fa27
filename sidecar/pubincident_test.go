package sidecar

import (
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/nats-io/nats.go/jetstream"
)

// fakeClock is a pubIncident clock the test moves; its readings keep the
// monotonic clock, as time.Now's do.
type fakeClock struct{ t time.Time }

func (c *fakeClock) now() time.Time           { return c.t }
func (c *fakeClock) step(d time.Duration)     { c.t = c.t.Add(d) }
func (c *fakeClock) wallStep(d time.Duration) { c.t = testutil.WallStepped(c.t, d) }

func newIncident() (*pubIncident, *fakeClock, *testutil.SyncBuffer) {
	var logs testutil.SyncBuffer
	clock := &fakeClock{t: time.Now()}
	return &pubIncident{log: slog.New(slog.NewTextHandler(&logs, nil)), now: clock.now}, clock, &logs
}

var errAck = errors.New("nats: timeout")

// A failing spell warns at once, then at most once per publishErrLogEvery;
// it ends with one line (its failures and how long they went on) once
// publishes succeed with failures stopped for publishRecoverQuiet; a later
// incident counts its own failures, not the earlier one's unwarned ones.
func TestPubIncidentCountsPerIncidentAndLogsRecovery(t *testing.T) {
	p, clock, logs := newIncident()
	p.fail("e1", errAck) // warned at once
	clock.step(time.Second)
	p.fail("e1", errAck) // counted
	clock.step(2 * time.Second)
	p.fail("e1", errAck) // counted: these two are never warned about in this incident
	clock.step(time.Second)
	p.ok() // a newer delta acked, older acks may still time out: not over yet
	if strings.Contains(logs.String(), "succeeding again") {
		t.Fatalf("recovery logged while failures were still arriving:\n%s", logs)
	}
	clock.step(publishRecoverQuiet)
	p.ok()
	out := logs.String()
	if got := strings.Count(out, "delta publishes failing"); got != 1 {
		t.Fatalf("%d warnings in the first incident, want 1:\n%s", got, out)
	}
	if !strings.Contains(out, `succeeding again" failed_in_incident=3 failing_for=3s`) {
		t.Fatalf("the end of the incident is not logged with its 3 failures over 3s:\n%s", out)
	}
	p.ok() // once
	if got := strings.Count(logs.String(), "succeeding again"); got != 1 {
		t.Fatalf("recovery logged %d times", got)
	}

	// Minutes later, a new incident: its first warning counts its own failure.
	clock.step(4 * time.Minute)
	p.fail("e2", errAck)
	last := lastLine(logs.String())
	if !strings.Contains(last, `failing" failed=1 failed_in_incident=1`) {
		t.Fatalf("a new incident's first warning carries earlier failures: %s", last)
	}
}

// The warnings' spacing is measured on the monotonic clock: after the wall
// clock steps back 10 minutes, a failure publishErrLogEvery after the last
// warning warns, instead of waiting out the step.
func TestPubIncidentWarnsAcrossWallClockStepBack(t *testing.T) {
	p, clock, logs := newIncident()
	p.fail("e1", errAck)
	clock.wallStep(-10 * time.Minute)
	clock.step(publishErrLogEvery + time.Second)
	p.fail("e1", errAck)
	if got := strings.Count(logs.String(), "delta publishes failing"); got != 2 {
		t.Fatalf("%d warnings after a wall-clock step back, want 2:\n%s", got, logs)
	}
	// And the end of the incident too.
	clock.wallStep(-10 * time.Minute)
	clock.step(publishRecoverQuiet)
	p.ok()
	if !strings.Contains(logs.String(), "succeeding again") {
		t.Fatalf("recovery not logged across a wall-clock step back:\n%s", logs)
	}
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// An ack timeout is reported natsutil.PublishAckTimeout after its publish
// was sent: the incident is dated from the send, so a NATS outage whose
// publishes' timeouts arrive close together is not logged as failing for
// the fraction of a second between those reports.
func TestPubIncidentDatesAckTimeoutsFromTheirSend(t *testing.T) {
	p, clock, logs := newIncident()
	p.fail("e1", jetstream.ErrAsyncPublishTimeout)
	if !strings.Contains(logs.String(), "failing_for="+natsutil.PublishAckTimeout.String()) {
		t.Fatalf("the first ack timeout's warning does not date the incident from its publish:\n%s", logs)
	}
	clock.step(200 * time.Millisecond)
	p.fail("e1", jetstream.ErrAsyncPublishTimeout)
	clock.step(publishRecoverQuiet)
	p.ok()
	if want := "failing_for=" + (natsutil.PublishAckTimeout + 200*time.Millisecond).String(); !strings.Contains(lastLine(logs.String()), want) {
		t.Fatalf("the recovery line does not count from the first failed publish's send (%s):\n%s", want, logs)
	}
}
