//go:build race

package scheduler_test

// raceOn: the race detector makes sync.Pool drop items, so allocation
// counts are meaningless under -race.
const raceOn = true
