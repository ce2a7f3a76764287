package proxy

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv4RemotesCutLineLosesTheNextAddress: a line left without its
// newline (a write cut short by ENOSPC on a full tmpfs, or any stray bytes)
// must not glue itself to the next member's line, whose address would be
// lost to the fleet for good: that member never writes it again.
func TestAdv4RemotesCutLineLosesTheNextAddress(t *testing.T) {
	srv := discardUpstream(t)
	ms := newFleet(t, 2, nil)
	key := mustKey(t, &Transport{}, srv.URL)
	if err := os.WriteFile(ms[0].node.remotesFile(key), []byte("10.0.0.1:8"), 0o600); err != nil {
		t.Fatal(err)
	}
	resp, err := get(t, t.Context(), ms[0].tr, srv.URL+"/")
	if err != nil {
		t.Fatal(err)
	}
	drain(resp)
	b, _ := os.ReadFile(ms[0].node.remotesFile(key))
	if got := ms[1].node.lingering(key); got < 0 {
		t.Errorf("a member dialed %s and published it after a cut line (file %q); a sibling's lingering = %d, want the address known", srv.URL, b, got)
	}
}

// TestAdv4RemotesClosedNodeWritesNothing: the last member's Destruct
// removes the fleet's files, then the socket directory, which fails if
// anything is still in it. A Transport whose Node is closed (a request
// still on its way at Destruct) must not create files there.
func TestAdv4RemotesClosedNodeWritesNothing(t *testing.T) {
	srv := discardUpstream(t)
	ms := newFleet(t, 2, nil)
	dir := ms[0].node.sockDir
	ms[0].node.Close()
	RemoveFleetFiles(dir)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if resp, err := get(t, ctx, ms[0].tr, srv.URL+"/"); err == nil {
		drain(resp)
	}
	files, _ := filepath.Glob(filepath.Join(dir, remotesPrefix+"*"))
	if len(files) != 0 {
		t.Errorf("a closed node wrote %v after the fleet's files were removed", files)
	}
}

// TestAdv4RemotesConcurrentAppendsStayWhole: many members appending at once
// leave whole lines, every address readable.
func TestAdv4RemotesConcurrentAppendsStayWhole(t *testing.T) {
	ms := newFleet(t, 6, nil)
	key := orbitpool.Key{Hi: 7, Lo: 7}
	var wg sync.WaitGroup
	for i, m := range ms {
		m.node.setCap(key, 0, "x:1")
		kc := m.node.capOf(key)
		wg.Go(func() {
			for j := range maxRemotes {
				m.node.sawRemote(key, kc, netip.MustParseAddrPort(fmt.Sprintf("[fd00::%d:%d]:%d", i+1, j+1, 1000+j)))
			}
		})
	}
	wg.Wait()
	b, err := os.ReadFile(ms[0].node.remotesFile(key))
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Fields(string(b))
	if len(lines) != len(ms)*maxRemotes {
		t.Fatalf("%d lines, want %d", len(lines), len(ms)*maxRemotes)
	}
	for _, l := range lines {
		if _, err := netip.ParseAddrPort(l); err != nil {
			t.Fatalf("torn line %q", l)
		}
	}
	if got := parseRemotes(b); len(got) != maxFleetRemotes {
		t.Fatalf("parseRemotes kept %d, want %d", len(got), maxFleetRemotes)
	}
}

// TestAdv4RemotesHostileFilesBlockNothing: a huge file, one endless line, a
// directory, a symlink or an unreadable file in the addresses file's place
// neither blocks a request nor slows lingering (the dispatcher's), and a
// symlink's target is not written.
func TestAdv4RemotesHostileFilesBlockNothing(t *testing.T) {
	victim := filepath.Join(t.TempDir(), "victim")
	os.WriteFile(victim, []byte("keep"), 0o600)
	big := strings.Repeat("garbage that is not an address\n", 300000) + "127.0.0.9:9\n"
	for _, tc := range []struct {
		name  string
		plant func(path string) error
	}{
		{"huge", func(p string) error { return os.WriteFile(p, []byte(big), 0o600) }},
		{"endless-line", func(p string) error { return os.WriteFile(p, []byte(strings.Repeat("x", 8<<20)), 0o600) }},
		{"directory", func(p string) error { return os.Mkdir(p, 0o700) }},
		{"symlink", func(p string) error { return os.Symlink(victim, p) }},
		{"unreadable", func(p string) error { return os.WriteFile(p, nil, 0o000) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// An upstream of its own: a previous case's connections may still
			// be closing, and counted, at the last one's address.
			srv := discardUpstream(t)
			ms := newFleet(t, 2, nil)
			key := mustKey(t, &Transport{}, srv.URL)
			if err := tc.plant(ms[0].node.remotesFile(key)); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			resp, err := get(t, ctx, ms[0].tr, srv.URL+"/")
			if err != nil {
				t.Fatal(err)
			}
			drain(resp)
			start := time.Now()
			got := ms[1].node.lingering(key)
			if d := time.Since(start); d > 500*time.Millisecond {
				t.Errorf("lingering took %v", d)
			}
			if tc.name == "huge" && got != 0 {
				t.Errorf("lingering = %d with the file's last line an address, want 0", got)
			}
			if got0 := ms[0].node.lingering(key); got0 != 0 {
				t.Errorf("the dialer's own lingering = %d, want 0", got0)
			}
			if b, _ := os.ReadFile(victim); string(b) != "keep" {
				t.Fatalf("symlink target written: %q", b)
			}
		})
	}
}

// TestAdv4RemotesIPv6AndStableDials: an IPv6 literal upstream is published
// once, however many connections are dialed to it.
func TestAdv4RemotesIPv6AndStableDials(t *testing.T) {
	ln, err := net.Listen("tcp", "[::1]:0")
	if err != nil {
		t.Fatal("no IPv6 loopback:", err)
	}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
	}))
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	ms := newFleet(t, 2, nil)
	key := mustKey(t, &Transport{}, srv.URL)
	for range 20 {
		resp, err := get(t, t.Context(), ms[0].tr, srv.URL+"/")
		if err != nil {
			t.Fatal(err)
		}
		drain(resp)
	}
	b, _ := os.ReadFile(ms[0].node.remotesFile(key))
	want := "\n" + ln.Addr().(*net.TCPAddr).AddrPort().String() + "\n"
	if string(b) != want {
		t.Fatalf("after 20 dials the file is %q, want %q", b, want)
	}
	// Not 0: the last connection may still be closing.
	if got := ms[1].node.lingering(key); got < 0 {
		t.Fatalf("sibling's lingering = %d, want the address known", got)
	}
}
