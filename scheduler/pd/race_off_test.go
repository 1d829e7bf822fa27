//go:build !race

package pd

// raceEnabled: allocation guards run only without the race detector, which
// makes sync.Pool drop items (make test's unit-norace runs them).
const raceEnabled = false
