package ingress

import "bytes"

// Answer reads what the engine's answer says of its output, as the
// ingress's proxy reads it (proxy.go for a JSON answer, proxyStream.observe
// for a stream): the usage's completion or output tokens, else, in a
// stream, one token per output event. A calling proxy that sees the answer
// pass (the endpoint picker's response phase) hands it over in order, cut
// at line ends only, or, for a line longer than it holds, after a comma: no
// usage member or event prefix read here holds a newline or a comma. Done
// then settles the token budgets with the output tokens (--key-output-tpm,
// --model-output-tpm) and learns from them as the ingress does (output
// lengths, token metrics, TPOT samples).
func (p *Picked) Answer(b []byte) {
	c := p.c
	if c == nil || len(b) == 0 || c.ep == epOther {
		return // the embeddings family produces no output tokens
	}
	c.readUsage(b) // tokencheck.go
	if !c.req.stream {
		if n := usageCompletionTokens(b); n > 0 {
			c.outTokens = n
		}
		if c.ep == epResponses || c.ep == epMessages {
			if i := bytes.LastIndex(b, outTokensKey); i >= 0 {
				c.outTokens = uintAt(b, i+len(outTokensKey))
			}
		}
		return
	}
	if named := namedStreamOf(c.ep); named != nil {
		named.outTokens(c, b)
		return
	}
	c.countEvents(b, p.errorEvent) // proxystream.go
}

// errorEvent keeps the first error event's status (an engine's error inside
// a 200 stream), which Done gives the request as the ingress's proxy does.
func (p *Picked) errorEvent(ev []byte) {
	if p.errCode == 0 {
		p.errCode = errorEventStatus(ev)
	}
}

// OutputTokens is the output counted so far (Answer).
func (p *Picked) OutputTokens() int { return p.c.outTokens }
