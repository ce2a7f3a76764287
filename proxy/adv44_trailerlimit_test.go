package proxy

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv44TrailerBlockOverLimitDropsStream: the trailer block of a relayed
// HTTP/2 response is read at the body's EOF (body.readTrailerBlock),
// bounded by the sibling's own header limit. When that read fails (the
// block runs past the limit, or a line of it is malformed), Read still
// ends the body as a clean EOF (eof was decided before the block was read),
// so the unix stream goes back to the idle pool with the rest of the block
// unread on it: the next exchange on that stream reads trailer lines where
// its answer's frame should be (TestAdv44TrailerOverSiblingLimitNextExchange). net/http never reuses a connection whose
// response it could not read to its end; the stream must be dropped.
func TestAdv44TrailerBlockOverLimitDropsStream(t *testing.T) {
	for _, tc := range []struct {
		name  string
		block string
	}{
		{"overlimit", strings.Repeat("X-Big: "+strings.Repeat("v", 200)+"\r\n", 200) + "\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sib, own := streamPair(t)
			answer := appendResponseFrame(nil, responseFrame{typ: frameAccept})
			answer = appendHead(answer, headProto2)
			answer = append(answer, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n"...)
			answer = append(answer, tc.block...)
			// An owner that answers and keeps its end of the stream open,
			// as a live owner does between exchanges.
			seen := make(chan error, 1)
			go func() {
				br := bufio.NewReader(own)
				if _, err := readFrame(br, reqHeaderLen, decodeRequestFrame); err != nil {
					seen <- err
					return
				}
				if _, err := http.ReadRequest(br); err != nil {
					seen <- err
					return
				}
				_, err := own.Write(answer)
				seen <- err
			}()
			defer own.Close()
			p := oneStream(t, sib, 3)
			defer p.close()
			req, _ := http.NewRequest("GET", "http://upstream.test/trailers", nil)
			// A small header limit (the sibling's): 3*256+4096 bytes of
			// trailer block, a 40 KB block is over it.
			resp, err := p.roundTrip(req, 3, orbitpool.Lease{}, &remoteOpts{maxHeaderBytes: 256}, 1, nil)
			if err != nil {
				t.Fatal(err)
			}
			b, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if err := <-seen; err != nil {
				t.Fatalf("owner: %v", err)
			}
			if rerr == nil {
				t.Fatalf("body %q read with no error; the trailer block was bad", b)
			}
			// The body's end released the stream (or not) synchronously.
			if n := len(p.idle[3]); n != 0 {
				left := make([]byte, 64)
				sib.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
				k, _ := io.ReadFull(sib, left)
				t.Fatalf("after %v the unix stream went back to the idle pool (%d idle) with the rest of the trailer block unread on it (%q...): the next exchange on it reads that as its answer",
					rerr, n, left[:k])
			}
		})
	}
}

// TestAdv44TrailerOverSiblingLimitNextExchange: in a fleet, MaxResponseHeaderBytes is
// per process and not part of the Key, so a sibling with a smaller limit
// borrows the owner's HTTP/2 connection. An upstream answer whose trailers
// are over the sibling's limit fails there (as net/http's HTTP/2 client
// with that limit fails it), but the unix stream is kept with the rest of
// the trailer block on it, and the sibling's next request, an ordinary
// one, fails on the leftover bytes. net/http never lets one response's
// failure spoil the next exchange.
func TestAdv44TrailerOverSiblingLimitNextExchange(t *testing.T) {
	var big []string
	for i := range 60 {
		big = append(big, fmt.Sprintf("x-t-%03d", i), strings.Repeat("v", 200))
	}
	up := newRawH2(t, func(s *rawStream) {
		if s.path == "/big" {
			s.headers(false, ":status", "200")
			s.data(false, []byte("ok"))
			s.headers(true, big...)
			return
		}
		s.headers(false, ":status", "200", "content-length", "2")
		s.data(true, []byte("ok"))
	})
	i := 0
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.MaxConnsPerKey = 1
		tr.H2C = true
		if i == 1 {
			tr.MaxResponseHeaderBytes = 1024
		}
		i++
	})
	owner, client := ms[0], ms[1]
	if err := getOK(owner, context.Background(), up.url+"/"); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/big", nil)
	resp, err := client.tr.RoundTrip(req)
	if err == nil {
		_, err = io.ReadAll(resp.Body)
		resp.Body.Close()
	}
	t.Logf("the big trailers: %v", err)
	if st := client.node.Stats(); st.ReusedRemote == 0 {
		t.Fatalf("the sibling's request did not go through the owner (%+v)", st)
	}
	for k := range 3 {
		if err := getOK(client, ctx, up.url+"/next"); err != nil {
			t.Errorf("request %d after the over-limit trailers: %v; want 200 \"ok\"", k, err)
		}
	}
}
