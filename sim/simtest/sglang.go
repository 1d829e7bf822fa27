package simtest

import "testing"

// StartSGLangForTest starts a cluster of SGLang-mode simulators
// (--disaggregation-mode prefill|decode, each prefill engine's bootstrap
// server on loopback: sim.Server.BootstrapAddr), closed when tb ends. A
// router sends the same request to a prefill and a decode engine at once,
// both carrying BootstrapFields of the prefill engine and one random
// bootstrap_room.
func StartSGLangForTest(tb testing.TB, o PDOptions) *PD {
	tb.Helper()
	o.Protocol = SGLang
	return StartPDForTest(tb, o)
}
