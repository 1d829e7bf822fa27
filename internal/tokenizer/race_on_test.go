//go:build race

package tokenizer

// raceEnabled lets the slowest cases (long_text.txt) be skipped under -race;
// they run in every plain `go test`.
const raceEnabled = true
