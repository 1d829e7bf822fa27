package ingress

// setRequestID names a picked request as the ingress names the requests
// it serves (keepForwardHeaders): id, the X-Request-Id the data plane sent
// (Envoy makes one per request by default), when it is 1–128 bytes of
// visible ASCII, else one of the ingress's own. The access log writes it,
// a refusal's line too.
func (c *call) setRequestID(id []byte) {
	if validRequestID(id) {
		c.fwd[fwdRequestID] = append(c.fwd[fwdRequestID][:0], id...)
	} else {
		c.fwd[fwdRequestID] = appendRequestID(c.fwd[fwdRequestID][:0])
	}
}

// RequestID is the request's id (PickInput.RequestID, or the ingress's
// own): a calling proxy forwards it to the engine when it is not the one
// the request came with. The slice is p's: copy it before Done.
func (p *Picked) RequestID() []byte { return p.c.requestID() }
