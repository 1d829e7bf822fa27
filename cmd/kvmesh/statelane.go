package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
)

// stateLaneEnv sets --state-over-nats's default. An older kvmesh ignores
// an environment variable it does not know but exits on a flag it does not
// know, so the variable is the way to turn the lane off that survives
// rolling the image back past the lane (docs/INSTALL.md, "Roll back").
const stateLaneEnv = "KVMESH_STATE_OVER_NATS"

// stateLaneFlag binds --state-over-nats (default true, or
// $KVMESH_STATE_OVER_NATS) onto a field that says the opposite (the
// configs' zero value runs the lane).
func stateLaneFlag(fs *flag.FlagSet, off *bool, usage string, probs *flagProblems) {
	if v, ok := os.LookupEnv(stateLaneEnv); ok {
		if err := (*invertedBool)(off).Set(v); err != nil {
			probs.unlessGiven("state-over-nats", fmt.Errorf("%s=%q: not a boolean", stateLaneEnv, v))
		}
	}
	fs.Var(&givenBool{(*invertedBool)(off), func() { probs.given("state-over-nats") }}, "state-over-nats", usage+" (env "+stateLaneEnv+")")
}

// givenBool is a boolean flag that calls given when it is set: a flag
// given replaces a bad default from the environment.
type givenBool struct {
	*invertedBool
	given func()
}

func (b *givenBool) Set(s string) error {
	b.given()
	return b.invertedBool.Set(s)
}

// invertedBool is a boolean flag stored negated.
type invertedBool bool

func (b *invertedBool) String() string {
	if b == nil {
		return "true"
	}
	return strconv.FormatBool(!bool(*b))
}

func (b *invertedBool) Set(s string) error {
	v, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	*b = invertedBool(!v)
	return nil
}

func (b *invertedBool) IsBoolFlag() bool { return true }
