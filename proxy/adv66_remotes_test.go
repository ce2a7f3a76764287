package proxy

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const adv66ChildEnv = "ADV66_REMOTES_CHILD"

// TestAdv66RemotesCrossProcessLosesNoAppend: members in separate processes
// (this binary run again) append to a file about to be rewritten, at the
// same instant. flock is per open file description; across processes each
// has its own. Every address appended is in the file afterwards.
func TestAdv66RemotesCrossProcessLosesNoAppend(t *testing.T) {
	if path := os.Getenv(adv66ChildEnv); path != "" {
		id, _ := strconv.Atoi(os.Getenv("ADV66_ID"))
		at, _ := strconv.ParseInt(os.Getenv("ADV66_AT"), 10, 64)
		time.Sleep(time.Until(time.Unix(0, at)))
		for j := range 4 {
			if err := appendRemote(path, netip.MustParseAddrPort(fmt.Sprintf("192.0.2.%d:%d", id+1, 1000+j))); err != nil {
				fmt.Fprintln(os.Stderr, "append:", err)
				os.Exit(3)
			}
		}
		os.Exit(0)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	const procs = 6
	for trial := range 5 {
		path := nearlyFullRemotes(t, dir, trial, 40)
		at := time.Now().Add(150 * time.Millisecond).UnixNano()
		var cmds []*exec.Cmd
		for i := range procs {
			c := exec.Command(exe, "-test.run=^TestAdv66RemotesCrossProcessLosesNoAppend$")
			c.Env = append(os.Environ(), adv66ChildEnv+"="+path, fmt.Sprintf("ADV66_ID=%d", i), fmt.Sprintf("ADV66_AT=%d", at))
			c.Stderr = os.Stderr
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			cmds = append(cmds, c)
		}
		for _, c := range cmds {
			if err := c.Wait(); err != nil {
				t.Fatalf("trial %d: child: %v", trial, err)
			}
		}
		got := parseRemotes(readRegular(path, maxRemotesFile))
		for i := range procs {
			for j := range 4 {
				a := netip.MustParseAddrPort(fmt.Sprintf("192.0.2.%d:%d", i+1, 1000+j))
				if !slices.Contains(got, a) {
					t.Fatalf("trial %d: %v was appended by process %d and is not in the file: %v", trial, a, i, got)
				}
			}
		}
		if st, err := os.Lstat(path); err != nil || st.Size() > maxRemotesFile {
			t.Fatalf("trial %d: the file was not rewritten: %v %v", trial, st, err)
		}
		if _, err := os.Lstat(path + ".tmp"); err == nil {
			t.Fatalf("trial %d: a temporary file was left behind", trial)
		}
	}
}

// TestAdv66RemotesHeldLockBoundsTheDial: a member stopped (SIGSTOP, a CPU
// quota's throttling) while it holds the file's lock: an append gives up
// within remotesLockWait and a little more.
func TestAdv66RemotesHeldLockBoundsTheDial(t *testing.T) {
	path := filepath.Join(t.TempDir(), remotesPrefix+"k")
	if err := os.WriteFile(path, []byte("10.0.0.1:80\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	holder, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Close()
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = appendRemote(path, netip.MustParseAddrPort("192.0.2.1:80"))
	if d := time.Since(start); err == nil || d > 3*remotesLockWait {
		t.Fatalf("append under a lock held elsewhere: %v after %v", err, d)
	}
}

// TestAdv66RemotesAppendLostToTheLockIsNeverRetried: the lock brings a way
// for an append to fail: another member holding it for over remotesLockWait
// (stopped, or throttled by a CPU quota, between its flock and its close).
// The member whose append gave up had marked the address told (sawRemote
// sets published before publishRemote runs), so no later dial to that
// address told the fleet again, for the life of the process: the member
// that inherits this one's share after a crash could not count its
// connections.
func TestAdv66RemotesAppendLostToTheLockIsNeverRetried(t *testing.T) {
	ms := newFleet(t, 2, nil)
	key := mustKey(t, &Transport{}, "http://upstream.example:80")
	n := ms[0].node
	n.setCap(key, 0, "upstream.example:80")
	kc := n.capOf(key)
	path := n.remotesFile(key)
	if err := os.WriteFile(path, []byte("10.0.0.1:80\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	holder, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(holder.Fd()), unix.LOCK_EX); err != nil {
		t.Fatal(err)
	}
	a := netip.MustParseAddrPort("192.0.2.7:80")
	n.sawRemote(key, kc, a) // a dial while another member holds the lock
	holder.Close()          // that member runs again
	for range 5 {
		n.sawRemote(key, kc, a) // later dials to the same address
	}
	if got := ms[1].node.fleetRemotes(key); !slices.Contains(got, a) {
		t.Errorf("member 0 dialed %v (again once the lock was free) and the fleet's file says %v", a, got)
	}
}
