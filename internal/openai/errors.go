package openai

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
)

// ErrorDetail is the inner object of an OpenAI error body.
type ErrorDetail struct {
	Message string          `json:"message"`
	Type    string          `json:"type"`
	Param   *string         `json:"param"`
	Code    json.RawMessage `json:"code"`
}

// ErrorResponse is the OpenAI error body {"error":{"message","type","param","code"}}.
type ErrorResponse struct {
	Error ErrorDetail `json:"error"`
}

// Error types, as OpenAI and vLLM name them.
const (
	TypeInvalidRequest = "invalid_request_error"
	TypeNotFound       = "NotFoundError"
	TypeAuthentication = "authentication_error"
	TypeRateLimit      = "rate_limit_exceeded"
	TypeServer         = "server_error"
	TypeOverloaded     = "service_unavailable"
)

// AppendError appends an OpenAI error body. param "" is written as null;
// code "" as null, an all-digit code as a JSON number (vLLM writes the HTTP
// status there), anything else as a string (OpenAI's codes).
func AppendError(dst []byte, message, typ, param, code string) []byte {
	dst = append(dst, `{"error":{"message":`...)
	dst = AppendString(dst, message)
	dst = append(dst, `,"type":`...)
	dst = AppendString(dst, typ)
	dst = append(dst, `,"param":`...)
	dst = appendNullableString(dst, param)
	dst = append(dst, `,"code":`...)
	switch {
	case code == "":
		dst = append(dst, "null"...)
	case allDigits(code):
		dst = append(dst, code...)
	default:
		dst = AppendString(dst, code)
	}
	return append(dst, "}}"...)
}

// AppendStatusError appends the body vLLM returns for an HTTP status: the
// type from the status and the status as code.
func AppendStatusError(dst []byte, status int, message string) []byte {
	return AppendError(dst, message, TypeForStatus(status), "", fmt.Sprint(status))
}

// TypeForStatus is the error type for an HTTP status.
func TypeForStatus(status int) string {
	switch {
	case status == http.StatusNotFound:
		return TypeNotFound
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return TypeAuthentication
	case status == http.StatusTooManyRequests:
		return TypeRateLimit
	case status == http.StatusServiceUnavailable:
		return TypeOverloaded
	case status >= 500:
		return TypeServer
	}
	return TypeInvalidRequest
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return len(s) > 0 && len(s) < 10
}

// DecodeError decodes an OpenAI error body. ok is false when b is not one
// (a stream payload that is a normal chunk, for instance).
func DecodeError(b []byte) (ErrorDetail, bool) {
	b = bytes.TrimSpace(b)
	if !bytes.HasPrefix(b, []byte("{")) || !bytes.Contains(b, []byte(`"error"`)) {
		return ErrorDetail{}, false
	}
	var r struct {
		Error *ErrorDetail `json:"error"`
	}
	if err := json.Unmarshal(b, &r); err != nil || r.Error == nil {
		return ErrorDetail{}, false
	}
	return *r.Error, true
}
