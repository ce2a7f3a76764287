package proxy

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestParseRemotesSkipsWhatItCannotRead: an addresses file is read line by
// line; a line cut short or not an address is skipped, a repeat is kept
// once, where it was last written, and of more than maxFleetRemotes the
// last are kept.
func TestParseRemotesSkipsWhatItCannotRead(t *testing.T) {
	got := parseRemotes([]byte("127.0.0.1:8080\nlocalhost:80\n[::1]:443\n127.0.0.1:8080\n10.0.0.1\n\n127.0.0.2:1"))
	want := []netip.AddrPort{netip.MustParseAddrPort("[::1]:443"), netip.MustParseAddrPort("127.0.0.1:8080")}
	if !slices.Equal(got, want) {
		t.Fatalf("parseRemotes = %v, want %v", got, want)
	}
	var b strings.Builder
	for i := range maxFleetRemotes + 5 {
		fmt.Fprintf(&b, "127.0.0.1:%d\n", 1000+i)
	}
	got = parseRemotes([]byte(b.String()))
	if len(got) != maxFleetRemotes || got[0].Port() != 1005 || got[len(got)-1].Port() != 1000+maxFleetRemotes+4 {
		t.Fatalf("of %d addresses, kept %v; want the last %d", maxFleetRemotes+5, got, maxFleetRemotes)
	}
}

func FuzzParseRemotes(f *testing.F) {
	f.Add([]byte("127.0.0.1:8080\n[::1]:443\n"))
	f.Add([]byte("127.0.0.1:8080\n127.0.0.1:8080\n1.2.3.4:5"))
	f.Fuzz(func(t *testing.T, b []byte) {
		got := parseRemotes(b)
		if len(got) > maxFleetRemotes || len(got) > strings.Count(string(b), "\n") {
			t.Fatalf("%d addresses from %d bytes, %d lines", len(got), len(b), strings.Count(string(b), "\n"))
		}
		for i, a := range got {
			if !a.IsValid() || slices.Contains(got[:i], a) {
				t.Fatalf("invalid or repeated address kept: %v", got)
			}
		}
	})
}

// TestReadRegularKeepsTheLastWholeLines: of a file longer than the limit,
// the end is read, from the first line that starts within it; a line that
// ends exactly where the limit starts is not cut.
func TestReadRegularKeepsTheLastWholeLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	for _, tc := range []struct {
		content string
		limit   int64
		want    string
	}{
		{"aaa\nbbb\nccc\n", 12, "aaa\nbbb\nccc\n"},
		{"aaa\nbbb\nccc\n", 10, "bbb\nccc\n"},
		{"aaa\nbbb\nccc\n", 8, "bbb\nccc\n"},
		{"aaa\nbbb\nccc\n", 7, "ccc\n"},
		{"aaaaaaaaaaaa", 4, ""},
	} {
		if err := os.WriteFile(path, []byte(tc.content), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := string(readRegular(path, tc.limit)); got != tc.want {
			t.Errorf("readRegular(%q, %d) = %q, want %q", tc.content, tc.limit, got, tc.want)
		}
	}
}

// TestFleetLearnsTheAddressesItsMembersDial: the address a member dials for
// a key (by name, here) is known to a sibling that never used the key, once,
// however often it is dialed; the sibling's lingering asks the kernel about
// it (not -1, "cannot tell"). A FIFO in the file's place blocks no one.
func TestFleetLearnsTheAddressesItsMembersDial(t *testing.T) {
	srv := discardUpstream(t)
	addr := strings.TrimPrefix(srv.URL, "http://")
	url := "http://localhost:" + srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	ms := newFleet(t, 2, nil)
	key := mustKey(t, &Transport{}, url)
	if got := ms[1].node.lingering(key); got != -1 {
		t.Fatalf("a sibling's lingering = %d before its sibling dialed, want -1 (no address known)", got)
	}
	for range 3 {
		ms[0].tr.CloseIdleConnections()
		resp, err := get(t, t.Context(), ms[0].tr, url+"/")
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
		// Not 0: the connection closed before may still be closing.
		if got := ms[1].node.lingering(key); got < 0 {
			t.Fatalf("a sibling's lingering = %d once its sibling dialed, want the address known", got)
		}
	}
	b, err := os.ReadFile(ms[0].node.remotesFile(key))
	if err != nil {
		t.Fatal(err)
	}
	if string(b) != "\n"+addr+"\n" {
		t.Fatalf("after 3 dials, the addresses file is %q, want %q once", b, addr)
	}

	other := orbitpool.Key{Hi: 3, Lo: 4}
	if err := syscall.Mkfifo(ms[1].node.remotesFile(other), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan int, 1)
	go func() { done <- ms[1].node.lingering(other) }()
	select {
	case got := <-done:
		if got != -1 {
			t.Fatalf("lingering with a FIFO for the file = %d, want -1", got)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("lingering blocked on a FIFO in the addresses file's place")
	}
	RemoveFleetFiles(ms[0].node.sockDir)
	if _, err := os.Stat(ms[0].node.remotesFile(key)); !os.IsNotExist(err) {
		t.Fatalf("after RemoveFleetFiles: %v", err)
	}
}
