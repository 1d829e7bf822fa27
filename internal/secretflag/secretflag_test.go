package secretflag

import (
	"flag"
	"io"
	"strings"
	"testing"
)

// The environment sets the default, a flag given replaces it, and neither
// -h nor a parse error's usage dump shows either value.
func TestVarHidesSecret(t *testing.T) {
	t.Setenv("T_SECRET", "env-s3cret")
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "env-s3cret"},
		{[]string{"--pw", "flag-s3cret"}, "flag-s3cret"},
		{[]string{"--pw", ""}, ""},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var help strings.Builder
		fs.SetOutput(&help)
		dst := "config-s3cret"
		Var(fs, &dst, "pw", "T_SECRET", "a `password`")
		if err := fs.Parse(c.args); err != nil || dst != c.want {
			t.Errorf("%q: %q, %v; want %q", c.args, dst, err, c.want)
		}
		fs.Parse([]string{"--no-such-flag"}) // the usage dump a typo prints
		fs.PrintDefaults()
		if strings.Contains(help.String(), "s3cret") || !strings.Contains(help.String(), "-pw password\n") ||
			!strings.Contains(help.String(), "a password (env T_SECRET; set)") {
			t.Errorf("%q: help %q", c.args, help.String())
		}
	}
	t.Setenv("T_SECRET", "")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	dst := "config-s3cret"
	Var(fs, &dst, "pw", "T_SECRET", "pw")
	if dst != "config-s3cret" || fs.Lookup("pw").Usage != "pw (env T_SECRET; set)" {
		t.Errorf("empty env: %q, usage %q", dst, fs.Lookup("pw").Usage)
	}
	var none string
	Var(fs, &none, "other", "T_SECRET", "other")
	if fs.Lookup("other").Usage != "other (env T_SECRET)" {
		t.Errorf("no default: usage %q", fs.Lookup("other").Usage)
	}
}
