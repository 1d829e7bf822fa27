package ingress

// The engine's other JSON endpoints — /v1/embeddings, /pooling, /classify,
// /score and /v1/score, /rerank, /v1/rerank and /v2/rerank, /tokenize and
// /detokenize, as vLLM serves them — go through the same request path as
// generation (authentication, model routes, limits, admission, health,
// retries before the first byte, metrics, access log), routed by load: their
// bodies take many shapes (input, documents, text_1/text_2, queries), none a
// prompt whose blocks the engines cache for later generation, so no prefix is
// keyed. The body is forwarded as it came, to the same path. The model is
// required (it selects the engines).

// passthrough sets what the request path needs of an endpoint it does not
// parse: no tokens, and a prompt-size estimate from the body for limits and
// the load charge. The estimate is no count: the access log's prompt_tokens
// and kvmesh_ingress_tokens_total{direction="in"} take the usage the
// engine's answer reports (embeddings, pooling, score), or nothing
// (promptCount: /tokenize, /detokenize, a failed request).
func (c *call) passthrough() {
	c.req.stream = false // these answer one JSON body
	c.tokens = nil
	c.approx = len(c.req.body)/4 + 1
}
