package keyvalue

import (
	"slices"
	"strings"
	"testing"
)

func TestSplit(t *testing.T) {
	got, err := Split("id=a,url=http://h:1/x=y,role=")
	if want := []Pair{{"id", "a"}, {"url", "http://h:1/x=y"}, {"role", ""}}; err != nil || !slices.Equal(got, want) {
		t.Fatalf("%v %v, want %v", got, err, want)
	}
	for spec, says := range map[string]string{
		"model=m,model=n": "model= given twice",
		"model=m,oops":    `"oops" is not key=value`,
		"=x":              `"=x" is not key=value`,
		"":                `"" is not key=value`,
	} {
		if _, err := Split(spec); err == nil || !strings.Contains(err.Error(), says) {
			t.Errorf("%q: %v, want %q", spec, err, says)
		}
	}
}

func FuzzSplit(f *testing.F) {
	for _, s := range []string{"id=a,model=m", "a=b=c", ",", "k=v,k=w", "=", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		pairs, err := Split(s)
		if err != nil {
			return
		}
		keys := map[string]bool{}
		for _, p := range pairs {
			if p.Key == "" || strings.Contains(p.Key, ",") || strings.Contains(p.Value, ",") || keys[p.Key] {
				t.Fatalf("%q: pair %+v", s, p)
			}
			keys[p.Key] = true
		}
	})
}
