package main

import (
	"bytes"
	"io"
	"strings"
	"testing"
)

// kvmesh epp refuses by name a flag it would ignore: its TLS files outside
// --grpc-tls=files (it served its self-signed certificate instead), the
// pool's flags without --pool-name, the ingress flags of what the gateway
// does, and --config.
func TestEPPFlagsNotRead(t *testing.T) {
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--grpc-tls-cert", "c.pem", "--grpc-tls-key", "k.pem"},
			[]string{"--grpc-tls-cert is not read without --grpc-tls=files", "--grpc-tls-key is not read without --grpc-tls=files"}},
		{[]string{"--grpc-tls", "off", "--grpc-tls-cert", "c.pem"}, []string{"--grpc-tls-cert is not read without --grpc-tls=files"}},
		{[]string{"--grpc-tls", "files", "--grpc-tls-cert", "c.pem", "--grpc-tls-key", "k.pem"}, nil},
		{[]string{"--kubeconfig", "/nonexist", "--pool-namespace", "x"},
			[]string{"--kubeconfig is not read without --pool-name", "--pool-namespace is not read without --pool-name"}},
		{[]string{"--pool-name", "p", "--pool-namespace", "x", "--kubeconfig", "/k"}, nil},
		{[]string{"--cors-origins", "*", "--max-attempts", "2", "--chat-mode", "completions", "--config", "x.yaml"},
			[]string{"--cors-origins is not read by kvmesh epp", "--max-attempts is not read by kvmesh epp",
				"--chat-mode is not read by kvmesh epp", "--config is not read by kvmesh epp"}},
		{[]string{"--access-log=false", "--send-timeout", "5s", "--upstream-ca", "ca.pem", "--upstream-idle-timeout", "1m", "--upstream-first-byte-timeout", "1m"}, nil}, // read: the access log of each pick, /metrics's listener, engine /tokenize
		// The picker's P/D threshold without its P/D, and the ingress's
		// P/D step, whose prefill leg the picker never runs: once each.
		{[]string{"--pd-min-uncached", "5"}, []string{"--pd-min-uncached is not read without --pd"}},
		{[]string{"--pd-min-uncached", "0"}, []string{"--pd-min-uncached is not read without --pd"}},
		{[]string{"--pd", "--pd-min-uncached", "5"}, nil},
		{[]string{"--pd-policy", "kvmesh", "--pd-transfer-gbps", "50"},
			[]string{"--pd-policy is not read by kvmesh epp", "--pd-transfer-gbps is not read by kvmesh epp"}},
		{[]string{"--pd-transfer-gbps", "50"}, []string{"--pd-transfer-gbps is not read by kvmesh epp"}},
	} {
		_, err := eppOptions(append([]string{"--engine", "m=http://127.0.0.1:1"}, c.args...), io.Discard)
		checkRefused(t, c.args, err, c.want)
	}
}

// `kvmesh epp -h` says which of the ingress's flags it refuses, where it
// listed them as if they worked.
func TestEPPHelpNamesRefusedFlags(t *testing.T) {
	var out, errOut bytes.Buffer
	run([]string{"epp", "-h"}, &out, &errOut)
	help := out.String() + errOut.String()
	for _, name := range []string{"config", "cors-origins", "max-attempts", "chat-mode", "pd-policy", "pd-transfer-gbps"} {
		i := strings.Index(help, "  -"+name+" ")
		if i < 0 || !strings.Contains(help[i:min(len(help), i+200)], "not read by kvmesh epp: refused") {
			t.Errorf("epp -h on --%s does not say it is refused", name)
		}
	}
}
