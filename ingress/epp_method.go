package ingress

// MethodNotAllowed is the ingress's 405 for a method path does not take
// (allow: the methods it does, for the Allow header): its status and its
// OpenAI error body.
func MethodNotAllowed(method, path, allow string) (status int, body []byte) {
	ae := methodNotAllowed(allow, []byte(method), []byte(path))
	return ae.status, appendErrorBody(nil, ae)
}

// ResponseNotFound is the ingress's 404 for a stored response's id no
// engine holds: its status and its OpenAI error body.
func ResponseNotFound(id string) (status int, body []byte) {
	ae := responseNotFound(id)
	return ae.status, appendErrorBody(nil, ae)
}
