package ingress

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"testing"
)

// An engine that closes the connection without answering fails the attempt
// with a message for an API client: fasthttp's own text ends with advice to
// the server's author ("make sure the server returns 'Connection: close'
// response header before closing the connection"), which reached clients.
// The log keeps the whole error.
func TestEngineClosedEarlySaysSoPlainly(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() { // owned by the listener: ends when the test closes it
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { // reads one request head, then hangs up
				defer c.Close()
				_, _ = http.ReadRequest(bufio.NewReader(c))
			}()
		}
	}()
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + ln.Addr().String()})
	cfg.MaxAttempts = 1
	s := startIngress(t, cfg, Deps{})
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1],"max_tokens":1}`)
	body := string(b)
	if st < 500 || !strings.Contains(body, "engine e: "+errClosedEarly) || strings.Contains(body, "make sure") || !strings.Contains(body, `"error":{`) {
		t.Fatalf("status %d: %s", st, body)
	}
}
