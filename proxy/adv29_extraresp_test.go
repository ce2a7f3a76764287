package proxy

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv29OwnerExtraResponseNotReadAsNext: a buggy owner writes, after the
// response to a sibling's request, a second answer (accept frame and
// response) that nobody asked for: what a late write of an earlier
// exchange's goroutine would leave (TestH2Late1xxAfterErrorFrame was one
// such). It comes in the same write, or a moment later, once the sibling
// has put its stream back idle. As net/http does on a reused connection
// ("Unsolicited response received on idle HTTP channel"), the sibling must
// not keep or reuse a stream with bytes pending, so that its next request
// never gets the answer of another exchange.
func TestAdv29OwnerExtraResponseNotReadAsNext(t *testing.T) {
	for _, late := range []bool{false, true} {
		name := "same-write"
		if late {
			name = "late"
		}
		t.Run(name, func(t *testing.T) { adv29ExtraResponse(t, late) })
	}
}

func adv29ExtraResponse(t *testing.T, late bool) {
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	owner, err := orbitpool.Open(spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { owner.Close() })
	client := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	url := "http://127.0.0.1:1" // never dialed: the owner's resource serves it
	key := mustKey(t, client.tr, url)
	cp, err := owner.ClaimCreate(key, orbitpool.Limits{MaxResources: 1, MaxCreating: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cp.Register(1); err != nil {
		t.Fatal(err)
	}
	ln, err := listenUnix(SocketPath(SocketDir(spec.Path), owner.Lane()))
	if err != nil {
		t.Fatal(err)
	}
	var (
		wg    sync.WaitGroup
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	answer := func(body string) []byte {
		out := appendResponseFrame(nil, responseFrame{typ: frameAccept})
		out = appendHead(out, 0)
		return append(out, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n"+body...)
	}
	// The first exchange only gets the stray: one that a fresh stream's
	// owner sent while the next request was already on its way would be in
	// flight, which no check of an idle stream can see.
	var strayOnce sync.Once
	strayOut := make(chan struct{})
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(10 * time.Second))
				br := bufio.NewReader(c)
				for {
					f, err := readFrame(br, reqHeaderLen, decodeRequestFrame)
					if err != nil {
						return
					}
					var l orbitpool.Lease
					if l.UnmarshalBinary(f.leaseBytes()) != nil {
						return
					}
					exec, err := owner.Accept(l)
					if err != nil {
						return
					}
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					out := answer("first")
					stray := false
					strayOnce.Do(func() { stray = true })
					if stray && late {
						c.Write(out)
						out = nil
						time.Sleep(50 * time.Millisecond)
					}
					if stray {
						out = append(out, answer("EVIL!")...)
					}
					c.Write(out)
					if stray {
						close(strayOut)
					}
					exec.Complete()
				}
			})
		}
	})
	for i := range 3 {
		if i == 1 {
			select {
			case <-strayOut:
			case <-time.After(5 * time.Second):
				t.Fatal("the stray answer was not written")
			}
			time.Sleep(50 * time.Millisecond)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/", nil)
		resp, err := client.tr.RoundTrip(req)
		if err != nil {
			cancel()
			t.Fatalf("request %d: %v", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		cancel()
		if string(b) != "first" {
			t.Fatalf("request %d got %q, the answer to another exchange (want %q)", i, b, "first")
		}
	}
}
