package kvevents

import "errors"

// Errors shared by the subscriber and kvtest's publisher.
var (
	ErrConfig = errors.New("invalid configuration")
	ErrClosed = errors.New("closed")
)
