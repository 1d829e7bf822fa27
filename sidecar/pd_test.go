package sidecar

import (
	"errors"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/gossip"
)

// TestPDEngineConfig: the P/D group, protocol and bootstrap port parse from
// a DaemonSet spec, an SGLang prefill engine gossips its bootstrap address
// (the URL's host, port 8998 by default), and bad values are listed.
func TestPDEngineConfig(t *testing.T) {
	e, err := ParseEngineSpec("id=p,model=m,url=http://10.0.0.5:30000,events=tcp://10.0.0.5:5557,role=prefill,group=llama-0,pd=sglang,bootstrap=8995")
	if err != nil {
		t.Fatal(err)
	}
	if e.PDGroup != "llama-0" || e.PDProtocol != PDProtocolSGLang || e.Bootstrap() != "10.0.0.5:8995" {
		t.Fatalf("parsed %+v, bootstrap %q", e, e.Bootstrap())
	}
	e.BootstrapPort = 0
	if e.Bootstrap() != "10.0.0.5:8998" {
		t.Fatalf("default bootstrap %q", e.Bootstrap())
	}
	for _, other := range []EngineConfig{
		{Role: "decode", PDProtocol: PDProtocolSGLang, URL: "http://h:1"},
		{Role: "prefill", PDProtocol: PDProtocolNIXL, URL: "http://h:1"},
		{Role: "prefill", PDProtocol: PDProtocolSGLang},
	} {
		if b := other.Bootstrap(); b != "" {
			t.Errorf("%+v gossips bootstrap %q", other, b)
		}
	}
	if gossipPDProtocol(PDProtocolSGLang) != gossip.PDProtocolSGLang || gossipPDProtocol(PDProtocolNIXL) != "" || gossipPDProtocol("") != "" {
		t.Error("gossiped protocol: want sglang for SGLang, empty for NIXL")
	}
	c := DefaultConfig()
	c.Engines = []EngineConfig{{ID: "a", Model: "m", Events: "tcp://h:1", PDProtocol: "mooncake", BootstrapPort: 70000}}
	err = c.Validate()
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "P/D protocol") || !strings.Contains(err.Error(), "bootstrap port") {
		t.Fatalf("Validate: %v", err)
	}
}
