package proxy

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
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
// lines on stdout.
const adv73bEnv = "ORBIT_ADV73B_CHILD"

// runAdv73bChild is the body of the child processes of the adv73b
// multi-process tests.
//
//	fire K URL   start K concurrent GETs of URL, not waiting for them -> fired
//	warm K URL   K concurrent GETs of URL, waiting for them -> warmed N
//	loop K URL   K goroutines sending GETs of URL until killed -> looping
//	exit
func runAdv73bChild() int {
	say := func(f string, a ...any) { fmt.Printf(f+"\n", a...) }
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

// startAdv73bChild starts a member process (see runAdv73bChild) on seg
// with MaxConnsPerKey budget and env.
func startAdv73bChild(t *testing.T, seg string, budget int, env ...string) *child {
	t.Helper()
	return spawnChild(t, append([]string{adv73bEnv + "=1", "ORBIT_SEG=" + seg, fmt.Sprintf("ORBIT_BUDGET=%d", budget)}, env...)...)
}

// kill SIGKILLs the child and waits until it is reaped (its sockets closed
// by the kernel).
func (c *child) kill(t *testing.T) {
	t.Helper()
	if err := c.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	c.cmd.Wait()
}

// adv73bResult is how one of adv73bSender's requests ended.
type adv73bResult struct {
	id  string
	err error
	at  time.Time
}

// adv73bSender returns send, which starts a request through tr to url with
// id and the query q (body, if not nil, of length bytes, without GetBody:
// not replayable), and the channel where each ends: an error unless it was
// answered "ok".
func adv73bSender(t *testing.T, ctx context.Context, tr *Transport, url string) (send func(method, id, q string, body io.Reader, length int64), results <-chan adv73bResult) {
	ch := make(chan adv73bResult, 16)
	return func(method, id, q string, body io.Reader, length int64) {
		req, err := http.NewRequestWithContext(ctx, method, url+"/?id="+id+q, nil)
		if err != nil {
			t.Fatal(err)
		}
		if body != nil {
			req.Body = io.NopCloser(body)
			req.ContentLength = length
		}
		go func() {
			resp, err := tr.RoundTrip(req)
			if err == nil {
				var b []byte
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && string(b) != "ok" {
					err = fmt.Errorf("status %d body %q", resp.StatusCode, b)
				}
			}
			ch <- adv73bResult{id, err, time.Now()}
		}()
	}, ch
}

// adv73bMember joins the fleet on seg (lanes lanes, or testSpec's if 0) as
// the children run: as the Caddy module does (DefaultReclaimHold 1s;
// shorter here), a dead process's share stays held a while, and longer
// while the upstream still holds its connections.
func adv73bMember(t *testing.T, seg string, lanes int, conf func(*Transport)) *member {
	spec := testSpec
	spec.Path = seg
	if lanes > 0 {
		spec.Lanes = lanes
	}
	return newMemberPoolOpts(t, spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond, ReclaimHold: 200 * time.Millisecond},
		NodeOptions{SweepInterval: 50 * time.Millisecond}, conf)
}
