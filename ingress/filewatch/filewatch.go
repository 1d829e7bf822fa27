// Package filewatch tells a hot-reloaded file's owner when the file
// changed, by polling its modification time and size: a ConfigMap or a
// Secret mounted in a pod changes by a symlink swap, which a poll sees
// without an fsnotify dependency. The ingress's route file and API keys
// file reload through it.
package filewatch

import (
	"os"
	"time"
)

// File is one watched file's last seen state. It is owned by one
// goroutine (the poller's); its methods are not safe for concurrent use.
type File struct {
	path    string
	modTime time.Time
	size    int64 // -1: unreadable at the last look
}

// New stats path once; the error is os.Stat's (the file is then taken as
// unreadable, and the first Poll that reads it reports a change).
func New(path string) (*File, error) {
	f := &File{path: path}
	st, err := os.Stat(path)
	if err != nil {
		f.size = -1
		return f, err
	}
	f.modTime, f.size = st.ModTime(), st.Size()
	return f, nil
}

// Poll stats the file: changed when its modification time or size differ
// from the last look (the owner reloads it then). err is non-nil only on
// the first look that cannot read the file after one that could, so the
// owner logs a missing file once until it is back.
func (f *File) Poll() (changed bool, err error) {
	st, err := os.Stat(f.path)
	if err != nil {
		if f.size == -1 {
			return false, nil
		}
		f.size = -1
		return false, err
	}
	if st.ModTime().Equal(f.modTime) && st.Size() == f.size {
		return false, nil
	}
	f.modTime, f.size = st.ModTime(), st.Size()
	return true, nil
}
