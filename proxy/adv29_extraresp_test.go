package proxy

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv29OwnerExtraResponseNotReadAsNext: a buggy owner writes, after the
// response to a sibling's request, a second answer (accept frame and
// response) that nobody asked for, in the same write: what a late write of
// an earlier exchange's goroutine would leave (TestH2Late1xxAfterErrorFrame
// was one such). As net/http does on a reused connection ("Unsolicited
// response received on idle HTTP channel"), the sibling must not keep a
// stream with bytes pending, so that its next request never gets the
// answer of another exchange.
func TestAdv29OwnerExtraResponseNotReadAsNext(t *testing.T) {
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
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for n := 0; ; n++ {
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
					if n == 0 {
						out = appendResponseFrame(out, responseFrame{typ: frameAccept})
						out = appendHead(out, 0)
						out = append(out, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nEVIL!"...)
					}
					c.Write(out)
					exec.Complete()
				}
			}()
		}
	}()
	for i, want := range []string{"first", "first"} {
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
		if string(b) != want {
			t.Fatalf("request %d got %q, the answer to another exchange (want %q)", i, b, want)
		}
	}
}
