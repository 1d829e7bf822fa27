package natsutil

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"
)

// connectFailed warns of a new reason at once and of a repeated one at
// most every connectErrEvery, counting the attempts in between, and never
// shows the password.
func TestConnectErrorRateLimited(t *testing.T) {
	var logs bytes.Buffer // the handler runs on this goroutine here
	at := time.Unix(1000, 0)
	cfg := DefaultConfig()
	cfg.URLs = []string{"nats://u:pw-s3cret@h:4222"}
	cfg.User, cfg.Password = "u", "pw-s3cret"
	h := connectFailed(cfg, slog.New(slog.NewTextHandler(&logs, nil)), func() time.Time { return at })
	lines := func() int { return strings.Count(logs.String(), "\n") }
	refused := errors.New("dial tcp h:4222: connect: connection refused")
	for range 5 {
		h(nil, refused)
	}
	if n := lines(); n != 1 {
		t.Fatalf("5 equal errors in a moment: %d warnings, want 1:\n%s", n, logs.String())
	}
	h(nil, errors.New("tls: failed to verify certificate: x509: certificate signed by unknown authority (pw-s3cret)"))
	if n := lines(); n != 2 || !strings.Contains(logs.String(), "failed on TLS") {
		t.Fatalf("a new reason is not warned at once:\n%s", logs.String())
	}
	at = at.Add(connectErrEvery)
	h(nil, errors.New("tls: failed to verify certificate: x509: certificate signed by unknown authority (pw-s3cret)"))
	if n := lines(); n != 3 {
		t.Fatalf("the same reason %v later: %d warnings, want 3:\n%s", connectErrEvery, n, logs.String())
	}
	if l := logs.String(); strings.Contains(l, "pw-s3cret") || !strings.Contains(l, "same_error_since_last_warning=0") {
		t.Fatalf("password shown, or count missing:\n%s", l)
	}
	h(nil, refused)
	h(nil, refused)
	at = at.Add(connectErrEvery)
	h(nil, refused)
	if l := logs.String(); !strings.Contains(l, "same_error_since_last_warning=1") {
		t.Fatalf("the repeats in between are not counted:\n%s", l)
	}
}
