package scheduler

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"
)

// A DecodeError is a problem decoding a config file at a line (an unknown
// field, a value of the wrong type). It wraps ErrConfig. ParseConfig lists
// decoding problems first, in file order, then validation problems.
type DecodeError struct {
	Line int // 1-based; 0 when the block was built in code
	Msg  string
}

func (e *DecodeError) Error() string {
	if e.Line == 0 {
		return fmt.Sprintf("%v: yaml: %s", ErrConfig, e.Msg)
	}
	return fmt.Sprintf("%v: yaml: line %d: %s", ErrConfig, e.Line, e.Msg)
}

// Unwrap makes errors.Is(err, ErrConfig) true.
func (e *DecodeError) Unwrap() error { return ErrConfig }

// DecodeParams decodes a plugin's parameter block onto dst, a pointer to
// the plugin's config struct already holding its defaults: a field the
// block omits keeps its default, a field it gives is kept as given (an
// explicit 0 included). Decoding is strict: a field dst's type does not
// have is an error naming the type, as a strict yaml.Decoder would say it.
// A nil block (the config has none) leaves dst as it is. Every problem is
// returned, each a *DecodeError, joined.
//
// A block is a *yaml.Node rather than bytes so that errors keep the line
// of the file they came from. JSON is YAML, so a JSON block decodes too.
func DecodeParams(params *yaml.Node, dst any) error {
	if params == nil {
		return nil
	}
	var errs []error
	unknownFields(params, reflect.TypeOf(dst), &errs)
	if err := params.Decode(dst); err != nil {
		errs = append(errs, decodeErrors(err)...)
	}
	return errors.Join(errs...)
}

// decodeErrors turns a yaml error into DecodeErrors, one per problem,
// keeping the line yaml reports ("line 5: cannot unmarshal ...").
func decodeErrors(err error) []error {
	var te *yaml.TypeError
	if !errors.As(err, &te) {
		return []error{lineError(strings.TrimPrefix(err.Error(), "yaml: "))}
	}
	out := make([]error, 0, len(te.Errors))
	for _, s := range te.Errors {
		out = append(out, lineError(s))
	}
	return out
}

// lineError parses yaml's "line N: msg" form.
func lineError(s string) *DecodeError {
	if rest, ok := strings.CutPrefix(s, "line "); ok {
		if num, msg, ok := strings.Cut(rest, ": "); ok {
			if n, err := strconv.Atoi(num); err == nil {
				return &DecodeError{Line: n, Msg: msg}
			}
		}
	}
	return &DecodeError{Msg: s}
}

// unknownFields reports every mapping key in n that t (a struct, or a
// pointer, slice or map of them) has no field for. yaml.Node.Decode has no
// strict mode, so this is the KnownFields check for blocks decoded from a
// node. A struct with an inline map accepts any key.
//
// Aliases are not followed: an anchor's content is checked where it is
// defined, and following them could loop (an anchor may contain itself)
// or blow up (many aliases of one large anchor).
func unknownFields(n *yaml.Node, t reflect.Type, errs *[]error) {
	if n.Kind == yaml.AliasNode {
		return
	}
	if n.Kind == yaml.DocumentNode {
		for _, c := range n.Content {
			unknownFields(c, t, errs)
		}
		return
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch {
	case t.Kind() == reflect.Struct && n.Kind == yaml.MappingNode:
		fields, inline := yamlFields(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			if ft, ok := fields[k.Value]; ok {
				unknownFields(v, ft, errs)
			} else if !inline {
				*errs = append(*errs, &DecodeError{Line: k.Line, Msg: fmt.Sprintf("field %s not found in type %s", k.Value, t)})
			}
		}
	case (t.Kind() == reflect.Slice || t.Kind() == reflect.Array) && n.Kind == yaml.SequenceNode:
		for _, c := range n.Content {
			unknownFields(c, t.Elem(), errs)
		}
	case t.Kind() == reflect.Map && n.Kind == yaml.MappingNode:
		for i := 1; i < len(n.Content); i += 2 {
			unknownFields(n.Content[i], t.Elem(), errs)
		}
	}
}

// yamlFields maps a struct's yaml keys to field types, as yaml.v3 names
// them (the tag's name, else the lower-cased field name), following inline
// structs; inline reports an inline map.
func yamlFields(t reflect.Type) (fields map[string]reflect.Type, inline bool) {
	fields = make(map[string]reflect.Type, t.NumField())
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if strings.Contains(","+opts+",", ",inline,") {
			switch f.Type.Kind() {
			case reflect.Map:
				inline = true
			case reflect.Struct:
				sub, in := yamlFields(f.Type)
				for k, v := range sub {
					fields[k] = v
				}
				inline = inline || in
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		fields[name] = f.Type
	}
	return fields, inline
}
