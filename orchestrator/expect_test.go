package orchestrator

import "testing"

func TestGenerations(t *testing.T) {
	var g generations
	if g.stale("a", 1) {
		t.Fatal("no write yet: nothing is stale")
	}
	g.expect("a", 3)
	g.expect("a", 2) // an older write's answer does not lower the expectation
	if !g.stale("a", 2) {
		t.Fatal("generation 2 after a write that made 3: want stale")
	}
	if g.stale("b", 1) {
		t.Fatal("another deployment is not stale")
	}
	if g.stale("a", 3) {
		t.Fatal("the cache caught up: want fresh")
	}
	if g.stale("a", 2) {
		t.Fatal("once caught up the expectation is dropped")
	}
}
