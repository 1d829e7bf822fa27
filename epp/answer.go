package epp

import "bytes"

// maxAnswerLine bounds what the picker holds of the engine's answer: the
// part of a line that has not ended yet. A non-streamed answer is one
// line of JSON; past the bound, what is held is read up to its last comma
// and the rest kept (Picked.Answer's readers match no comma).
const maxAnswerLine = 64 << 10

// answerLines cuts the engine's answer, as its chunks pass through the
// response phase, into whole lines for Picked.Answer, holding at most
// maxAnswerLine bytes: the picker reads the answer's usage (its output
// tokens) without buffering it.
type answerLines struct {
	part []byte // the line begun and not ended
}

// add reads b, the answer's next chunk; read gets every whole line.
func (a *answerLines) add(b []byte, read func([]byte)) {
	if len(a.part) > 0 {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			a.hold(b, read)
			return
		}
		a.hold(b[:i+1], read)
		read(a.part)
		a.part = a.part[:0]
		b = b[i+1:]
	}
	if j := bytes.LastIndexByte(b, '\n'); j >= 0 {
		read(b[:j+1])
		b = b[j+1:]
	}
	a.hold(b, read)
}

// end reads what is held: the answer ended.
func (a *answerLines) end(read func([]byte)) {
	if len(a.part) > 0 {
		read(a.part)
	}
	a.part = a.part[:0]
}

// hold keeps b, the start of a line; past maxAnswerLine what is held is
// read up to its last comma (all of it when it has none).
func (a *answerLines) hold(b []byte, read func([]byte)) {
	for len(a.part)+len(b) > maxAnswerLine {
		if len(a.part) == 0 {
			// Read the whole chunk up to its last comma in place.
			k := bytes.LastIndexByte(b, ',')
			if k < 0 {
				read(b)
				return
			}
			read(b[:k+1])
			b = b[k+1:]
			continue
		}
		n := min(len(b), maxAnswerLine-len(a.part))
		a.part = append(a.part, b[:n]...)
		b = b[n:]
		k := bytes.LastIndexByte(a.part, ',')
		if k < 0 {
			read(a.part)
			a.part = a.part[:0]
			continue
		}
		read(a.part[:k+1])
		a.part = append(a.part[:0], a.part[k+1:]...)
	}
	a.part = append(a.part, b...)
}
