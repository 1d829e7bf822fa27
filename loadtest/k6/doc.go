// Package k6 holds the k6 scripts of kvmesh's load scenarios (shared-prefix,
// trace replay, chat sessions) for users who run k6; see loadtest/README.md.
// It has no Go code. k6 cannot run here, so its tests check the scripts' syntax with node and
// run them under node with a fake of k6's API (testdata/fake-k6): the schedules and prompts the
// scripts send, on a virtual clock.
package k6
