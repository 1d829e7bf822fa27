// Package epp makes kvmesh the endpoint picker (EPP) of any gateway that
// implements the Gateway API Inference Extension v1: Envoy Gateway, Istio,
// kgateway, GKE. The gateway's Envoy opens one ext_proc (v3) gRPC stream per
// HTTP request; the picker reads the request's headers and body, asks the
// ingress's routing decision (ingress.Server.Pick: the same parse, tokenizer,
// block keys, index and scheduler the kvmesh ingress proxies with) and
// answers with the ordered endpoint list in the x-gateway-destination-endpoint
// header and the envoy.lb dynamic metadata, or an ImmediateResponse (503 when
// no endpoint fits, 429 when shedding, the ingress's status otherwise). It
// follows the response to charge the request to the engine that served it
// (x-gateway-destination-endpoint-served) until it ends.
//
// It buffers each request body until it routes, charged to the ingress's
// body budget (--max-body-in-flight), and decodes a compressed one as the
// ingress does (body.go).
//
// It owns the ext_proc protocol (process.go, protocol.go, body.go), the gRPC health
// service the gateway's failureMode relies on (server.go), the mapping from
// engines to pod endpoints and the InferencePool informer that narrows the
// candidates to the pool's ready pods (endpoints.go, pool.go), and the P/D
// hook that sets llm-d's x-prefiller-host-port (pd.go). It does not own
// routing (ingress, scheduler), the index or the mesh: the picker is an
// ingress replica that lets the gateway carry the bytes.
package epp
