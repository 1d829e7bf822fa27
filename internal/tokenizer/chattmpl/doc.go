// Package chattmpl is a compact interpreter for the subset of Jinja2 that
// Hugging Face chat templates use: text, {{ }} output, {% if/elif/else %},
// {% for %} (loop variables, else, inline if, break/continue), {% set %}
// (names, tuples, namespace attributes, blocks), {% macro %}, comments,
// whitespace control (-, +) with transformers' trim_blocks and lstrip_blocks,
// Python-like values and operators, the filters and tests templates use
// (trim, tojson, length, join, default, map, selectattr, …), string and dict
// methods (strip, split, startswith, get, items, …) and the globals
// raise_exception, namespace, range and strftime_now.
//
// It owns only template parsing and rendering; it knows nothing about
// tokenizers. Rendering is bounded (output size, steps, macro depth) so a
// hostile template fails with ErrRender instead of exhausting the process.
package chattmpl
