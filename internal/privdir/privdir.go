// Package privdir makes and checks the directories a fleet keeps its files
// and sockets in, so that no other user can read, replace or redirect them.
//
// A fleet's run and socket directories often sit in shared places (/tmp,
// /dev/shm), where another user may have created the name first, or planted a
// symlink in it, to make a process running as root write where it should not
// or to delete its sockets. A directory is therefore used only if it is a real
// directory, owned by the running user, with no group or other permission
// bits; and files are written in it without following symlinks.
package privdir

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Ensure creates dir with mode 0700 if it does not exist (and its missing
// parents, also 0700), and otherwise checks that the running user may trust
// it: not a symlink, a directory, owned by the effective uid, and closed to
// group and others.
func Ensure(dir string) error {
	if err := os.MkdirAll(filepath.Dir(dir), 0o700); err != nil {
		return fmt.Errorf("creating %s: %w", filepath.Dir(dir), err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("creating %s: %w", dir, err)
	}
	return Check(dir)
}

// Check reports why dir is not a directory only the running user can use.
func Check(dir string) error {
	var st unix.Stat_t
	if err := unix.Lstat(dir, &st); err != nil {
		return fmt.Errorf("checking %s: %w", dir, err)
	}
	switch {
	case st.Mode&unix.S_IFMT == unix.S_IFLNK:
		return fmt.Errorf("%s is a symbolic link; use a real directory that only this user can open", dir)
	case st.Mode&unix.S_IFMT != unix.S_IFDIR:
		return fmt.Errorf("%s is not a directory", dir)
	case int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to uid %d, not to this process's uid %d; remove it or choose another directory", dir, st.Uid, os.Geteuid())
	case st.Mode&0o077 != 0:
		return fmt.Errorf("%s has mode %#o; it must be 0700 (chmod 700 %s)", dir, st.Mode&0o777, dir)
	}
	return nil
}

// WriteFile replaces the file at path, in a directory Ensure accepted, with
// data and mode 0600: it writes a temporary file beside it, created anew and
// never through a symlink, then renames it into place, so a reader sees the
// old content or the new, never a part.
func WriteFile(path string, data []byte) error {
	tmp := path + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// OpenFile opens name in a directory Ensure accepted, creating it with mode
// 0600 if need be, and never through a symlink.
func OpenFile(path string, flag int) (*os.File, error) {
	return os.OpenFile(path, flag|unix.O_NOFOLLOW, 0o600)
}
