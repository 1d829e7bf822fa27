package kvevents_test

import (
	"context"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// Close and Probe wake the socket loop out of its poll: the loop may wait
// long for input when nothing is due (an idle engine cost a sidecar twenty
// polls a second), so neither may wait for the poll to end. Here the poll's
// shortest wait is an hour.
func TestCloseAndProbeWakeTheSocketLoop(t *testing.T) {
	sub, err := kvevents.NewSubscriber(kvevents.SubscriberConfig{Endpoint: "tcp://127.0.0.1:1", PollInterval: time.Hour, Logger: discardLogger()})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	for i := range 3 {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second) // a hang guard, not a timing assertion
		_, err := sub.Probe(ctx)
		cancel()
		if err != nil {
			t.Fatalf("probe %d with the loop in an hour-long poll: %v", i, err)
		}
	}
	closed := make(chan struct{})
	go func() { defer close(closed); _ = sub.Close() }()
	select {
	case <-closed:
	case <-time.After(30 * time.Second):
		t.Fatal("Close still waits 30 s for the loop's hour-long poll")
	}
}
