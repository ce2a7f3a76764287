package caddymodule

import (
	"bytes"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"unicode"

	"github.com/orbitproxy/orbit/internal/privdir"
	"github.com/orbitproxy/orbit/orbitpool"
)

// keyNames records the upstreams (scheme://host:port) a fleet's pool keys
// stand for. A key is a digest, so only a process that proxied to the
// upstream knows its name; each writes the names it learns into the fleet's
// socket directory, one file per key, so that every member's metrics and
// admin table name every key, also one it has never used itself.
type keyNames struct {
	dir   string // "" keeps the names in this process
	mu    sync.Mutex
	local map[orbitpool.Key][]string
}

// Bounds on what a key's file may hold, against a file grown or written by
// something else: names past them are not read.
const (
	maxNameFile = 64 << 10
	maxName     = 1024
)

// openKeyNames keeps the names in dir, creating it if need be; with dir ""
// the names stay in this process.
func openKeyNames(dir string) (*keyNames, error) {
	if dir != "" {
		if err := privdir.Ensure(dir); err != nil {
			return nil, err
		}
	}
	return &keyNames{dir: dir, local: make(map[orbitpool.Key][]string)}, nil
}

// add records that k stands for name. The first time this process learns
// it, it appends the name to k's file: one write of one line, which
// O_APPEND keeps whole when members append at once.
func (n *keyNames) add(k orbitpool.Key, name string) error {
	n.mu.Lock()
	defer n.mu.Unlock()
	if slices.Contains(n.local[k], name) {
		return nil
	}
	n.local[k] = append(n.local[k], name)
	if n.dir == "" || !validName([]byte(name)) {
		return nil
	}
	f, err := privdir.OpenFile(n.path(k), os.O_WRONLY|os.O_APPEND|os.O_CREATE)
	if err != nil {
		return err
	}
	_, err = f.Write([]byte(name + "\n"))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// of returns the names known for k, in this process or by the fleet, sorted.
func (n *keyNames) of(k orbitpool.Key) []string {
	n.mu.Lock()
	names := slices.Clone(n.local[k])
	n.mu.Unlock()
	if n.dir != "" {
		names = append(names, n.read(k)...)
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// read returns the well-formed names in k's file.
func (n *keyNames) read(k orbitpool.Key) []string {
	f, err := privdir.OpenFile(n.path(k), os.O_RDONLY)
	if err != nil {
		return nil
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxNameFile))
	if err != nil {
		return nil
	}
	var names []string
	for line := range bytes.Lines(b) {
		line, whole := bytes.CutSuffix(line, []byte("\n"))
		if whole && validName(line) {
			names = append(names, string(line))
		}
	}
	return names
}

func (n *keyNames) path(k orbitpool.Key) string { return filepath.Join(n.dir, k.String()) }

// remove deletes the fleet's names, when the last member leaves.
func (n *keyNames) remove() error {
	if n.dir == "" {
		return nil
	}
	err := os.RemoveAll(n.dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	return err
}

// validName reports whether b can be an upstream's name: short and
// printable, so one line of a key's file.
func validName(b []byte) bool {
	if len(b) == 0 || len(b) > maxName {
		return false
	}
	for _, r := range string(b) {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
