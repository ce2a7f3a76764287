package proxy

import (
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// TestAdv67bUnrewritableRemotesConcurrentAppends: members (each its own open
// file description, so flock excludes them as it does processes) append at
// once to a file past its bound whose rewrite is blocked: every address is
// on the file exactly once, on a line of its own, visible to a reader;
// nothing is left beside the file but the blocker; and once the blocker is
// gone, the next append rewrites the file keeping all of them.
func TestAdv67bUnrewritableRemotesConcurrentAppends(t *testing.T) {
	dir := t.TempDir()
	const members = 8 // maxRemotes: all of them fit what a reader takes
	for trial := range 20 {
		path := nearlyFullRemotes(t, dir, trial, 0)
		blocker := filepath.Join(path+".tmp", "in-the-way")
		if err := os.MkdirAll(blocker, 0o700); err != nil {
			t.Fatal(err)
		}
		want := make([]netip.AddrPort, members)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := range want {
			want[i] = netip.MustParseAddrPort(fmt.Sprintf("198.51.100.%d:443", i+1))
			wg.Go(func() {
				start.Wait()
				if err := appendRemote(path, want[i]); err != nil && !errors.Is(err, errRemotesUnbounded) {
					t.Error(err)
				}
			})
		}
		start.Done()
		wg.Wait()
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range want {
			if n := strings.Count(string(b), "\n"+a.String()+"\n"); n != 1 {
				t.Fatalf("trial %d: %v on its own line %d times, want 1", trial, a, n)
			}
		}
		got := parseRemotes(readRegular(path, maxRemotesFile))
		for _, a := range want {
			if !slices.Contains(got, a) {
				t.Fatalf("trial %d: a reader takes %v, without %v", trial, got, a)
			}
		}
		if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 2 {
			t.Fatalf("trial %d: files beside the addresses file: %v", trial, files)
		}
		if err := os.RemoveAll(path + ".tmp"); err != nil {
			t.Fatal(err)
		}
		last := netip.MustParseAddrPort("203.0.113.9:443")
		if err := appendRemote(path, last); err != nil {
			t.Fatalf("trial %d: append once unblocked: %v", trial, err)
		}
		if st, err := os.Stat(path); err != nil || st.Size() > maxRemotesFile {
			t.Fatalf("trial %d: not rewritten once unblocked: %v %v", trial, st.Size(), err)
		}
		got = parseRemotes(readRegular(path, maxRemotesFile))
		for _, a := range append(want, last) {
			if !slices.Contains(got, a) {
				t.Fatalf("trial %d: after the rewrite a reader takes %v, without %v", trial, got, a)
			}
		}
		os.Remove(path)
	}
}
