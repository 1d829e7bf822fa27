package ingress

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// Engine 4xx answers are relayed, as the engine judged the request itself.
// One whose body is not an error body a client's SDK reads (a proxy's or a
// framework's: FastAPI's {"detail": ...}, plain text, HTML) is relayed in
// the ingress's error shape instead, with the engine's status and message,
// so every error a client gets is an OpenAI (or, on the Messages API,
// Anthropic) error body.

// isErrorBody reports whether b is an error body the OpenAI and Anthropic
// SDKs read: {"error": {...}} (OpenAI's, vLLM's, Anthropic's inside
// {"type": "error"}) or vLLM's older flat {"object": "error", "message"}.
func isErrorBody(b []byte) bool {
	if _, ok := openai.DecodeError(b); ok {
		return true
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 || b[0] != '{' || !bytes.Contains(b, []byte(`"error"`)) {
		return false
	}
	var flat struct {
		Object  string  `json:"object"`
		Message *string `json:"message"`
	}
	return json.Unmarshal(b, &flat) == nil && flat.Object == "error" && flat.Message != nil
}

// engineErrorBody is the body an engine's answer b of status st (not 200)
// is relayed with: b itself when st is not an error or b is an error body
// (isErrorBody), else the ingress's own
// error with st and what b says (FastAPI's detail, or its text).
func engineErrorBody(st int, b []byte, messages bool) (out []byte, rewritten bool) {
	if st < 400 || isErrorBody(b) {
		return b, false
	}
	msg := engineText(b)
	if msg == "" {
		msg = fmt.Sprintf("the engine answered %d with no message", st)
	}
	ae := &apiError{status: st, typ: errorType4xx(st), msg: msg}
	if messages {
		return appendMessagesError(nil, ae), true
	}
	return appendErrorBody(nil, ae), true
}

// engineText is what a non-OpenAI error body says: a JSON object's message
// or FastAPI's detail (a string, or a validation error list as JSON), else
// the body as text; clipped, and "" for a body that is not UTF-8 text.
func engineText(b []byte) string {
	b = bytes.TrimSpace(b)
	if len(b) > maxErrorBody {
		b = b[:maxErrorBody]
	}
	if len(b) > 0 && b[0] == '{' && json.Valid(b) {
		var flat struct {
			Message string          `json:"message"`
			Detail  json.RawMessage `json:"detail"`
		}
		if json.Unmarshal(b, &flat) == nil {
			var s string
			switch {
			case flat.Message != "":
				return clip(flat.Message)
			case json.Unmarshal(flat.Detail, &s) == nil && s != "":
				return clip(s)
			case len(flat.Detail) > 0 && string(flat.Detail) != "null":
				return clip(string(flat.Detail))
			}
		}
	}
	if !utf8.Valid(b) {
		return ""
	}
	return clip(strings.Join(strings.Fields(string(b)), " "))
}

// errorType4xx is the OpenAI error type of a 4xx status.
func errorType4xx(st int) string {
	switch st {
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	}
	return "invalid_request_error"
}
