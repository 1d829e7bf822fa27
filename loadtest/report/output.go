package report

import (
	"fmt"
	"os"
	"path/filepath"
)

// CheckWritable reports whether a report file can be written at path,
// without writing it: a run of an hour must not end in "no such
// directory" with its results lost. An existing path must be a regular
// file this process may open for writing (it is not truncated here); a
// new one needs a directory it may create files in (a probe file is made
// there and removed).
func CheckWritable(flag, path string) error {
	if fi, err := os.Stat(path); err == nil {
		if !fi.Mode().IsRegular() {
			return fmt.Errorf("%s %s: not a regular file", flag, path)
		}
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("%s: %w", flag, err)
		}
		return f.Close()
	} else if !os.IsNotExist(err) {
		return fmt.Errorf("%s: %w", flag, err)
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".kvmesh-probe-*")
	if err != nil {
		return fmt.Errorf("%s %s: cannot create the file: %w", flag, path, err)
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}
