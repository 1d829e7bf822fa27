//go:build !race

package scheduler_test

const raceOn = false
