//go:build race

package pd

const raceEnabled = true
