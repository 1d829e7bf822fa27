// Package chattmpl is an interpreter for the Jinja that Hugging Face chat
// templates use, with the semantics of Python Jinja2 3.1 in transformers'
// environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
// loop controls, raise_exception, strftime_now, transformers' tojson): text,
// {{ }} output, {% if %}, {% for %} (else, inline if, recursive, loop
// variables), {% set %} (names, tuples, namespace attributes, blocks),
// {% macro %} and {% call %}, {% with %}, {% filter %}, {% raw %},
// {% generation %}, comments, whitespace control; Python values and
// operators (tuples, ranges, generators, % and str.format formatting) with
// Jinja2's scoping (a set in a loop body lasts one iteration, macros are
// lexically scoped); Jinja2's filters and tests and Python's str methods.
// What it cannot reproduce exactly (an object address, an integer beyond 64
// bits, a dict key that is not a string, …) fails with ErrRender instead of
// rendering something else.
//
// It owns only template parsing and rendering; it knows nothing about
// tokenizers. Rendering is bounded (steps, including every loop iteration;
// bytes of values built, each value and in all; bytes read; output size;
// nesting; macro depth) so a hostile template fails with ErrRender instead
// of exhausting the process; RenderBounded also stops at a deadline
// (ErrDeadline) or when its caller gives up (Bound.Stop).
package chattmpl
