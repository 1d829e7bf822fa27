package kvevents

import "testing"

func TestTierOf(t *testing.T) {
	tests := []struct {
		medium string
		want   Tier
	}{
		{"", TierGPU}, {"GPU", TierGPU}, {"gpu", TierGPU}, {"cuda:0", TierGPU}, {"HBM", TierGPU},
		{"CPU", TierCPU}, {"CPU_TIER1", TierCPU}, {"cpu_tier2", TierCPU}, {"host", TierCPU}, {"DRAM", TierCPU},
		{"STORAGE", TierOther}, {"DISK", TierOther}, {"G", TierOther}, {"lmcache-remote", TierOther},
	}
	for _, tt := range tests {
		if got := TierOf(tt.medium); got != tt.want {
			t.Errorf("TierOf(%q) = %s, want %s", tt.medium, got, tt.want)
		}
	}
	if TierGPU.String() != "gpu" || TierCPU.String() != "cpu" || TierOther.String() != "other" {
		t.Error("tier names")
	}
	if BlockStored.String() != "BlockStored" || EventKind(0).String() != "Unknown" {
		t.Error("event kind names")
	}
}
