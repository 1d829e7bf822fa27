package sim

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// TestValidateRefusesNonFinite: NaN compares false to every bound, so a
// check written "x <= 0 || x > max" let it through; Inf bandwidth makes
// every transfer take no time.
func TestValidateRefusesNonFinite(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	for name, tc := range map[string]struct {
		set  func(*Config)
		want string
	}{
		"time scale NaN": {func(c *Config) { c.TimeScale = nan }, "time scale"},
		"drop rate NaN":  {func(c *Config) { c.DropRate = nan }, "drop rate"},
		"eos rate NaN":   {func(c *Config) { c.EOSRate = nan }, "eos rate"},
		"gbps NaN":       {func(c *Config) { c.PD.DisaggregationMode = "decode"; c.PD.TransferGbps = nan }, "kv transfer gbps"},
		"gbps Inf":       {func(c *Config) { c.PD.DisaggregationMode = "decode"; c.PD.TransferGbps = inf }, "kv transfer gbps"},
		"max loras -1":   {func(c *Config) { c.LoRA.MaxLoRAs = -1 }, "max loras"},
		"header timeout": {func(c *Config) { c.ReadHeaderTimeout = -time.Second }, "read header timeout"},
	} {
		c := Config{}
		c.Engine.BlockSize, c.Engine.GPUBlocks = 16, 64
		tc.set(&c)
		err := c.Defaults().Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v; want an invalid config naming %q", name, err, tc.want)
		}
	}
}

// TestBuildValidates: Options.Build reports what Start would refuse, as a
// configuration problem (ErrConfig), before anything is bound.
func TestBuildValidates(t *testing.T) {
	o := DefaultOptions()
	o.Config.DP = -1
	o.Config.KVEvents = "localhost"
	_, err := o.Build(nil)
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "dp -1") || !strings.Contains(err.Error(), `endpoint "localhost"`) {
		t.Fatalf("Build: %v; want ErrConfig naming dp and the endpoint", err)
	}
	ok := DefaultOptions()
	if _, err := ok.Build(nil); err != nil {
		t.Fatalf("Build of the defaults: %v", err)
	}
}

// TestReadHeaderTimeoutDefault: the sim command keeps the 10 s slowloris
// guard; a test sets a longer one.
func TestReadHeaderTimeoutDefault(t *testing.T) {
	if d := (Config{}).Defaults().ReadHeaderTimeout; d != 10*time.Second {
		t.Fatalf("default read header timeout %v, want 10s", d)
	}
	s := startSim(t, nil)
	if d := s.httpSrv.ReadHeaderTimeout; d != time.Minute {
		t.Fatalf("server read header timeout %v, want the test's 1m", d)
	}
}
