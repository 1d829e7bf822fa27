package orchestrator

import (
	"io"
	"strings"
)

func stringsReader(s string) io.Reader { return strings.NewReader(s) }

func replaceAll(s, old, new string) string { return strings.ReplaceAll(s, old, new) }

func lower(s string) string { return strings.ToLower(s) }
