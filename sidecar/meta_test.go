package sidecar

import (
	"log/slog"
	"strings"
	"testing"
)

// F2: a model name too long for the gossip metadata is refused naming the
// engine, the field and the sizes, whichever --engine it is on.
func TestLongModelRefusedOnEveryEngine(t *testing.T) {
	long := strings.Repeat("m", 480)
	for _, specs := range [][]string{
		{"id=a,model=" + long + ",url=http://h:1,events=tcp://h:2", "id=b,model=m,url=http://h:3,events=tcp://h:4"},
		{"id=a,model=m,url=http://h:1,events=tcp://h:2", "id=b,model=" + long + ",url=http://h:3,events=tcp://h:4"},
	} {
		o := DefaultOptions()
		o.EngineSpecs = specs
		o.GossipBind = "127.0.0.1:0"
		cfg, err := o.Build(slog.Default())
		if err == nil {
			_, err = New(cfg)
		}
		if err == nil {
			t.Fatalf("%.40s...: accepted", specs)
		}
		for _, want := range []string{"gossip metadata of", "model 480 bytes", "limit 500", "shorten the model name"} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("error %q lacks %q", err, want)
			}
		}
	}
}
