// Package k6 holds the k6 scripts of kvmesh's load scenarios (shared-prefix,
// trace replay, chat sessions) for users who run k6; see loadtest/README.md.
// It has no Go code: its test only checks that every script is valid JavaScript.
package k6
