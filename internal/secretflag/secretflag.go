// Package secretflag binds string flags that carry a secret (a password,
// a token, a key) whose default may come from the environment: the flag
// package prints a flag's default in -h and after every parse error, and a
// secret there ends up in a pod's logs.
package secretflag

import (
	"flag"
	"fmt"
	"os"
)

// Var binds the string flag name onto dst. A non-empty $env replaces dst's
// value as the default, and the flag, given, replaces both. Help never
// shows the value: the usage ends in "(env ENV)", or "(env ENV; set)" when
// there is a default.
func Var(fs *flag.FlagSet, dst *string, name, env, usage string) {
	if v := os.Getenv(env); v != "" {
		*dst = v
	}
	state := ""
	if *dst != "" {
		state = "; set"
	}
	fs.Var((*value)(dst), name, fmt.Sprintf("%s (env %s%s)", usage, env, state))
}

// value is a string flag whose String is always empty: the flag package
// prints String as the default.
type value string

func (v *value) String() string { return "" }

func (v *value) Set(s string) error {
	*v = value(s)
	return nil
}
