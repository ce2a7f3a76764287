package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv75aOwnerLateExtraResponseNotReadAsNext: TestAdv29OwnerExtraResponse-
// NotReadAsNext with the extra answer written a moment after the response
// (a late write of an earlier exchange's goroutine), once the sibling has put
// its stream back idle. net/http's pool sees bytes arriving on an idle
// connection ("Unsolicited response received on idle HTTP channel") and
// closes it; THREATS.md asks the same of every reused connection, local or a
// sibling's, "nothing pending at any layer". The sibling's next request on
// that stream must get its own answer, never the stray one.
func TestAdv75aOwnerLateExtraResponseNotReadAsNext(t *testing.T) {
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
		conns []interface{ Close() error }
	)
	strayOut := make(chan struct{})
	var strayOnce sync.Once // the first exchange only
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Add(1)
			go func() {
				defer wg.Done()
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
					out := appendResponseFrame(nil, responseFrame{typ: frameAccept})
					out = appendHead(out, 0)
					out = append(out, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nfirst"...)
					c.Write(out)
					exec.Complete()
					strayOnce.Do(func() {
						time.Sleep(50 * time.Millisecond)
						out = appendResponseFrame(nil, responseFrame{typ: frameAccept})
						out = appendHead(out, 0)
						out = append(out, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!"...)
						c.Write(out)
						close(strayOut)
					})
				}
			}()
		}
	}()
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
			t.Fatalf("request %d got %q, the answer to another exchange (want %q): the idle unix stream had bytes pending when it was reused", i, b, "first")
		}
	}
}
