package main

import (
	"flag"
	"strconv"
)

// stateLaneFlag binds --state-over-nats (default true) onto a field that
// says the opposite (the configs' zero value runs the lane).
func stateLaneFlag(fs *flag.FlagSet, off *bool, usage string) {
	fs.Var((*invertedBool)(off), "state-over-nats", usage)
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
