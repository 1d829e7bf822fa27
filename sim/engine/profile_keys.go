package engine

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// profileKeys are ProfileFile's keys in file order, profileKinds their Go
// kinds (float64, int or string).
var profileKeys, profileKinds = func() ([]string, map[string]reflect.Kind) {
	t := reflect.TypeFor[ProfileFile]()
	kinds := make(map[string]reflect.Kind, t.NumField())
	var keys []string
	for i := range t.NumField() {
		k := t.Field(i).Tag.Get("yaml")
		keys = append(keys, k)
		kinds[k] = t.Field(i).Type.Kind()
	}
	return keys, kinds
}()

// checkProfileKeys lists what is wrong with a profile document's keys and
// numbers, each naming its line, key, value and what was wanted (the YAML
// decoder says "cannot unmarshal !!str `362e12` into float64", without the
// key, or truncates 2.5 sequences to 2). Numbers are YAML 1.2's: plain
// 362e12 (no dot needed), 1_000 and 0x10 are numbers; a quoted "362e12" is
// a string, refused here rather than guessed at, since quoting is how YAML
// says "not a number". A document that is not a mapping is left to the
// decoder.
func checkProfileKeys(doc *yaml.Node) []error {
	n := doc
	if n.Kind == yaml.DocumentNode && len(n.Content) == 1 {
		n = n.Content[0]
	}
	var errs []error
	checkMapping(n, 0, &errs)
	return errs
}

// checkMapping checks the keys and values of the mapping n, and those
// merged into it ("<<: *anchor"), at most a few merges deep.
func checkMapping(n *yaml.Node, depth int, errs *[]error) {
	n = unalias(n)
	if n == nil || n.Kind != yaml.MappingNode || depth > 8 {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if k.Kind == yaml.ScalarNode && k.ShortTag() == "!!merge" {
			if m := unalias(v); m != nil && m.Kind == yaml.SequenceNode {
				for _, e := range m.Content {
					checkMapping(e, depth+1, errs)
				}
			} else {
				checkMapping(v, depth+1, errs)
			}
			continue
		}
		kind, ok := profileKinds[k.Value]
		if !ok || k.Kind != yaml.ScalarNode {
			*errs = append(*errs, fmt.Errorf("line %d: unknown key %q (the keys: %s)", k.Line, k.Value, strings.Join(profileKeys, ", ")))
			continue
		}
		if kind == reflect.String {
			continue // the decoder names the line of a non-string
		}
		if err := checkNumber(unalias(v), kind == reflect.Int); err != nil {
			*errs = append(*errs, fmt.Errorf("line %d: %s: %w", v.Line, k.Value, err))
		}
	}
}

// unalias is the node an alias stands for (nil for a dangling one).
func unalias(n *yaml.Node) *yaml.Node {
	for i := 0; n != nil && n.Kind == yaml.AliasNode && i < 8; i++ {
		n = n.Alias
	}
	if n != nil && n.Kind == yaml.AliasNode {
		return nil
	}
	return n
}

// checkNumber says why v is not the number wanted (a whole one when
// integer), or nil; an empty value (null) is left to the checks of the
// decoded profile (a missing key).
func checkNumber(v *yaml.Node, integer bool) error {
	want := "want a number such as 362e12 or 3.62e+14"
	if integer {
		want = "want a whole number such as 2048"
	}
	if v == nil || v.Kind != yaml.ScalarNode {
		what := "nothing"
		if v != nil {
			what = map[yaml.Kind]string{yaml.MappingNode: "a mapping", yaml.SequenceNode: "a list"}[v.Kind]
		}
		if what == "" {
			what = "that"
		}
		return fmt.Errorf("%s, not %s", want, what)
	}
	switch v.ShortTag() {
	case "!!null":
		return nil
	case "!!int", "!!float":
		var f float64
		if err := v.Decode(&f); err != nil {
			return fmt.Errorf("%s: %s", v.Value, want)
		}
		switch {
		case integer && (math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f)):
			return fmt.Errorf("%s: %s, not a fraction", v.Value, want)
		case integer && (f < float64(math.MinInt) || f >= -float64(math.MinInt)):
			return fmt.Errorf("%s: out of range: %s", v.Value, want)
		}
		return nil
	case "!!str":
		s := strings.TrimSpace(v.Value)
		_, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
		quoted := v.Style&(yaml.SingleQuotedStyle|yaml.DoubleQuotedStyle) != 0
		switch {
		case errors.Is(err, strconv.ErrRange):
			return fmt.Errorf("%s: out of a float64's range: %s", s, want)
		case quoted && err == nil:
			return fmt.Errorf("%q is quoted, so YAML reads it as a string: %s, unquoted", v.Value, want)
		}
		return fmt.Errorf("%q is not a number: %s (no units: flops in FLOP/s, memBW in bytes/s)", v.Value, want)
	}
	return fmt.Errorf("%s is not a number (YAML reads it as a %s): %s", v.Value, strings.TrimPrefix(v.ShortTag(), "!!"), want)
}
