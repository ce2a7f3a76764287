package proxy

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAdv67RemotesRewriteFollowsNoPlantedLink: the rewrite's temporary
// (path + ".tmp") planted as a symlink to another file, or as a FIFO, in
// the socket directory: the rewrite neither writes through the link nor
// blocks on the FIFO, the victim is untouched, and the addresses file ends
// a private regular file holding the new address.
func TestAdv67RemotesRewriteFollowsNoPlantedLink(t *testing.T) {
	for _, plant := range []string{"symlink", "fifo"} {
		t.Run(plant, func(t *testing.T) {
			dir := t.TempDir()
			path := filepath.Join(dir, remotesPrefix+"k")
			victim := filepath.Join(t.TempDir(), "victim")
			if err := os.WriteFile(victim, []byte("precious\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			// A file just under the size at which an append rewrites it.
			var b strings.Builder
			for i := 0; b.Len() < maxRemotesFileSize-40; i++ {
				fmt.Fprintf(&b, "\n10.0.%d.%d:80\n", i/250, i%250)
			}
			b.WriteString(strings.Repeat("#", maxRemotesFileSize-5-b.Len())) // a cut line, skipped
			if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
				t.Fatal(err)
			}
			switch plant {
			case "symlink":
				if err := os.Symlink(victim, path+".tmp"); err != nil {
					t.Fatal(err)
				}
			case "fifo":
				if err := unix.Mkfifo(path+".tmp", 0o600); err != nil {
					t.Fatal(err)
				}
			}
			a := netip.MustParseAddrPort("192.0.2.7:8443")
			if err := appendRemote(path, a); err != nil {
				t.Fatalf("append: %v", err)
			}
			if got, _ := os.ReadFile(victim); string(got) != "precious\n" {
				t.Errorf("the victim now holds %q", got)
			}
			st, err := os.Lstat(path)
			if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
				t.Fatalf("the addresses file: %v, %v", st, err)
			}
			if st.Size() >= maxRemotesFileSize-40 {
				t.Fatalf("setup: not rewritten (%d bytes)", st.Size())
			}
			got := parseRemotes(readRegular(path, maxRemotesFile))
			if len(got) == 0 || got[len(got)-1] != a {
				t.Errorf("a reader takes %v, want %v last", got, a)
			}
		})
	}
}
