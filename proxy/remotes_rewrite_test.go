package proxy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// newestDistinct is the model of what a reader takes from an addresses file
// to which addrs were appended in order, with no bound on its size: the
// maxFleetRemotes addresses last appended, each once, oldest first.
func newestDistinct(addrs []netip.AddrPort) []netip.AddrPort {
	var out []netip.AddrPort
	for i := len(addrs) - 1; i >= 0 && len(out) < maxFleetRemotes; i-- {
		if !slices.Contains(out, addrs[i]) {
			out = append(out, addrs[i])
		}
	}
	slices.Reverse(out)
	return out
}

// TestRemotesFileStaysBounded: a fleet that restarts many times tells the
// fleet its addresses at every start. The file stays within
// maxRemotesFileSize, a private regular file with no temporary beside it,
// and a reader takes from it after every append what it would take from the
// whole log of appends.
func TestRemotesFileStaysBounded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, remotesPrefix+"k")
	rng := rand.New(rand.NewPCG(1, 2))
	var log []netip.AddrPort
	rewrites := 0
	for i := range 3000 {
		// 40 addresses, more than a reader keeps, the long IPv6 form too.
		a := netip.MustParseAddrPort(fmt.Sprintf("[fd00::%d]:%d", rng.IntN(40), 8000+i%3))
		before, _ := os.Stat(path)
		if err := appendRemote(path, a); err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		log = append(log, a)
		st, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		if st.Size() > maxRemotesFileSize {
			t.Fatalf("after %d appends the file holds %d bytes, over %d", i+1, st.Size(), maxRemotesFileSize)
		}
		if st.Mode() != 0o600 {
			t.Fatalf("after %d appends the file's mode is %v, want 0600", i+1, st.Mode())
		}
		if before != nil && !os.SameFile(before, st) {
			rewrites++
		}
		if got, want := parseRemotes(readRegular(path, maxRemotesFile)), newestDistinct(log); !slices.Equal(got, want) {
			t.Fatalf("after %d appends a reader takes\n%v\nwant\n%v", i+1, got, want)
		}
	}
	if rewrites == 0 {
		t.Fatal("the file was never rewritten")
	}
	if files, _ := filepath.Glob(filepath.Join(dir, "*")); len(files) != 1 {
		t.Fatalf("files beside the addresses file: %v", files)
	}
}

// TestRemotesRewriteLosesNoAppend: members append to a file that has just
// reached the size at which an append rewrites it. An append that went to
// the file a rewrite had read and replaced would be lost with it, and the
// member, which tells the fleet an address once, would not tell it again.
func TestRemotesRewriteLosesNoAppend(t *testing.T) {
	dir := t.TempDir()
	const members = 8
	for trial := range 200 {
		path := nearlyFullRemotes(t, dir, trial, 16)
		want := make([]netip.AddrPort, members)
		var start, wg sync.WaitGroup
		start.Add(1)
		for i := range want {
			want[i] = netip.MustParseAddrPort(fmt.Sprintf("192.0.2.%d:443", i+1))
			wg.Go(func() {
				start.Wait()
				if err := appendRemote(path, want[i]); err != nil {
					t.Error(err)
				}
			})
		}
		start.Done()
		wg.Wait()
		got := parseRemotes(readRegular(path, maxRemotesFile))
		for _, a := range want {
			if !slices.Contains(got, a) {
				t.Fatalf("trial %d: %v was appended and is not in the file: %v", trial, a, got)
			}
		}
	}
}

// nearlyFullRemotes writes the addresses file of trial in dir with
// addresses up to room bytes short of the size at which an append rewrites
// it, and returns its path.
func nearlyFullRemotes(t *testing.T, dir string, trial, room int) string {
	t.Helper()
	var filler strings.Builder
	for filler.Len() < maxRemotesFileSize-room {
		fmt.Fprintf(&filler, "10.0.0.%d:80\n", filler.Len()%20)
	}
	path := filepath.Join(dir, fmt.Sprintf("%s%d", remotesPrefix, trial))
	if err := os.WriteFile(path, []byte(filler.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestRemotesFileNotRewrittenStillTellsTheAddress: an append past the
// file's bound whose rewrite fails (here, a directory where the rewrite's
// temporary file goes) appends the address anyway, so readers see it, and
// says the file was not rewritten: no address is lost to a directory that
// takes no new file.
func TestRemotesFileNotRewrittenStillTellsTheAddress(t *testing.T) {
	dir := t.TempDir()
	path := nearlyFullRemotes(t, dir, 0, 8)
	if err := os.MkdirAll(filepath.Join(path+".tmp", "in-the-way"), 0o700); err != nil {
		t.Fatal(err)
	}
	before, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort("[2001:db8::1]:8443")
	err = appendRemote(path, a)
	if !errors.Is(err, errRemotesUnbounded) {
		t.Fatalf("append past the bound with the rewrite blocked: %v, want errRemotesUnbounded", err)
	}
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := before.Size() + int64(len(a.String())+2); st.Size() != want {
		t.Errorf("the file has %d bytes, want %d: the address on a line of its own appended", st.Size(), want)
	}
	got := parseRemotes(readRegular(path, maxRemotesFile))
	if !slices.Contains(got, a) {
		t.Errorf("a reader takes %v from the file, without %v", got, a)
	}
}
