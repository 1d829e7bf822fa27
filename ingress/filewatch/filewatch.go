// Package filewatch tells a hot-reloaded file's owner when the file
// changed, by polling its modification time and size, and its content's
// hash: a ConfigMap or a Secret mounted in a pod changes by a symlink swap,
// which a poll sees without an fsnotify dependency. The ingress's route
// file and API keys file reload through it.
package filewatch

import (
	"crypto/sha256"
	"os"
	"time"
)

// smallFile is the size up to which a file's content is hashed on every
// Poll. A larger one is hashed every hashEvery polls that find its
// modification time and size unchanged (and on every poll that finds them
// changed, to keep the baseline).
const (
	smallFile = 256 << 10
	hashEvery = 8
)

// File is one watched file's last seen state. It is owned by one
// goroutine (the poller's); its methods are not safe for concurrent use.
type File struct {
	path    string
	modTime time.Time
	size    int64 // -1: unreadable at the last look
	sum     [sha256.Size]byte
	hashed  bool // sum is the content's at the last look
	polls   int  // polls since the content was last hashed
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
	f.hash()
	return f, nil
}

// hash records the content's hash; a read that fails leaves it unknown
// (the next read sets it without reporting a change).
func (f *File) hash() (changed bool) {
	f.polls = 0
	b, err := os.ReadFile(f.path)
	if err != nil {
		f.hashed = false
		return false
	}
	sum := sha256.Sum256(b)
	changed = f.hashed && sum != f.sum
	f.sum, f.hashed = sum, true
	return changed
}

// Poll stats the file: changed when its modification time or size differ
// from the last look, or when they do not but its content does (a rewrite
// of the same length within the filesystem's timestamp granularity: an API
// key rotated to one as long). The content is compared on every poll for a
// file of at most smallFile bytes, else every hashEvery polls. The owner
// reloads the file when Poll says it changed. err is non-nil only on the
// first look that cannot read the file after one that could, so the owner
// logs a missing file once until it is back.
func (f *File) Poll() (changed bool, err error) {
	st, err := os.Stat(f.path)
	if err != nil {
		if f.size == -1 {
			return false, nil
		}
		f.size, f.hashed = -1, false
		return false, err
	}
	if st.ModTime().Equal(f.modTime) && st.Size() == f.size {
		f.polls++
		if st.Size() > smallFile && f.polls < hashEvery {
			return false, nil
		}
		return f.hash(), nil
	}
	f.modTime, f.size = st.ModTime(), st.Size()
	f.hash()
	return true, nil
}
