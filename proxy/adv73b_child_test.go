package proxy

import (
	"bufio"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// adv73bEnv makes the test binary a fleet member process (see TestMain)
// whose requests the parent steers line by line (stdin), answering
// "adv73b ..." lines on stdout.
const adv73bEnv = "ORBIT_ADV73B_CHILD"

// runAdv73bChild is the body of the child processes of the adv73b
// multi-process tests.
//
//	fire K URL   start K concurrent GETs of URL, not waiting for them -> fired
//	warm K URL   K concurrent GETs of URL, waiting for them -> warmed N
//	loop K URL   K goroutines sending GETs of URL until killed -> looping
//	exit
func runAdv73bChild() int {
	say := func(f string, a ...any) { fmt.Printf("adv73b "+f+"\n", a...) }
	spec := testSpec
	spec.Path = os.Getenv("ORBIT_SEG")
	if l, err := strconv.Atoi(os.Getenv("ORBIT_LANES")); err == nil {
		spec.Lanes = l
	}
	budget, _ := strconv.Atoi(os.Getenv("ORBIT_BUDGET"))
	hold, _ := time.ParseDuration(os.Getenv("ORBIT_HOLD"))
	p, err := orbitpool.Open(spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond, ReclaimHold: hold})
	if err != nil {
		say("error %v", err)
		return 1
	}
	nd, err := NewNode(p, NodeOptions{SweepInterval: 50 * time.Millisecond})
	if err != nil {
		say("error %v", err)
		return 1
	}
	tr := &Transport{Node: nd, MaxConnsPerKey: budget,
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, H2C: os.Getenv("ORBIT_H2C") != "", HTTP2: os.Getenv("ORBIT_HTTP2") != ""}
	say("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "fire", "warm":
			k, _ := strconv.Atoi(f[1])
			var wg sync.WaitGroup
			for range k {
				wg.Go(func() {
					req, _ := http.NewRequest("GET", f[2], nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
					}
				})
			}
			if f[0] == "fire" {
				say("fired")
				continue
			}
			wg.Wait()
			say("warmed %d", nd.Stats().OpenConns)
		case "loop":
			// loop K URL: K goroutines sending GETs of URL until killed.
			k, _ := strconv.Atoi(f[1])
			for range k {
				go func() {
					for {
						req, _ := http.NewRequest("GET", f[2], nil)
						if resp, err := tr.RoundTrip(req); err == nil {
							io.Copy(io.Discard, resp.Body)
							resp.Body.Close()
						}
					}
				}()
			}
			say("looping")
		case "exit":
			nd.Close()
			p.Close()
			return 0
		}
	}
	nd.Close()
	p.Close()
	return 0
}

type adv73bChild struct {
	cmd   *exec.Cmd
	in    io.WriteCloser
	lines chan string
}

// startAdv73bChild starts a member process on seg with MaxConnsPerKey
// budget; it is killed and reaped when t ends, whatever the outcome.
func startAdv73bChild(t *testing.T, seg string, budget int, env ...string) *adv73bChild {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), adv73bEnv+"=1", "ORBIT_SEG="+seg, fmt.Sprintf("ORBIT_BUDGET=%d", budget))
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &adv73bChild{cmd: cmd, in: in, lines: make(chan string, 64)}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			if l, ok := strings.CutPrefix(sc.Text(), "adv73b "); ok {
				c.lines <- l
			}
		}
		close(c.lines)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c.expect(t, "ready")
	return c
}

func (c *adv73bChild) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

func (c *adv73bChild) expect(t *testing.T, prefix string) string {
	t.Helper()
	select {
	case l, ok := <-c.lines:
		if !ok {
			t.Fatalf("child exited while waiting for %q", prefix)
		}
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("child said %q, want %q", l, prefix)
		}
		return strings.TrimSpace(strings.TrimPrefix(l, prefix))
	case <-time.After(20 * time.Second):
		t.Fatalf("child silent while waiting for %q", prefix)
	}
	return ""
}

// kill SIGKILLs the child and waits until it is reaped (its sockets closed
// by the kernel).
func (c *adv73bChild) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()
}
