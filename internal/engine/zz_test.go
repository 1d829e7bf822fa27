package engine
import "testing"
func TestZZ(t *testing.T){ t.Logf("fused with blocked waiting head: %d", DbgFusedWithWaiting) }
