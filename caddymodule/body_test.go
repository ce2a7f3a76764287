package caddymodule

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// pieces returns its parts one per Read, then io.EOF, and counts Closes.
type pieces struct {
	parts  []string
	closes int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(b, p.parts[0])
	p.parts[0] = p.parts[0][n:]
	if p.parts[0] == "" {
		p.parts = p.parts[1:]
	}
	return n, nil
}

func (p *pieces) Close() error { p.closes++; return nil }

func keptRequest(t *testing.T, body io.ReadCloser, n int64) *http.Request {
	ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{})
	req, err := http.NewRequestWithContext(ctx, "POST", "http://upstream.test/", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = n
	return req
}

// TestKeptBodyAcrossAttempts: reverse_proxy sends the same request, with the
// same body, to the next upstream after a dial error. What was read of a
// short body before and during the first attempt (all of it, or the first
// part) is sent again on the next, then the rest. An attempt closes
// reverse_proxy's body only if it read some of it past what was read ahead
// and not to its end (its writer may be blocked there): a body read to its
// end, or only as far as the read ahead (the first Read may return only the
// start of a short body), is the next attempt's to send.
func TestKeptBodyAcrossAttempts(t *testing.T) {
	for _, tc := range []struct {
		name   string
		parts  []string
		first  int // bytes the first attempt reads
		closes int // of reverse_proxy's body, by the first attempt
	}{
		{"whole", []string{"hello"}, 5, 0},
		{"part", []string{"he", "llo"}, 2, 0},
		{"part-then-rest", []string{"he", "llo"}, 5, 0},
		{"part-then-some", []string{"he", "l", "lo"}, 3, 1},
		{"unread", []string{"he", "llo"}, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &pieces{parts: tc.parts}
			req := keptRequest(t, src, 5)
			a, err := keptBodyFor(req)
			if err != nil {
				t.Fatal(err)
			}
			if tc.first > 0 {
				buf := make([]byte, 16)
				if n, _ := io.ReadAtLeast(a, buf, tc.first); n != tc.first {
					t.Fatalf("first attempt read %d bytes", n)
				}
				if tc.first == 5 {
					// The transport reads on to see the end.
					if n, err := a.Read(buf); n != 0 || err != io.EOF {
						t.Fatalf("after the body: %d, %v", n, err)
					}
				}
			}
			a.Close()
			if src.closes != tc.closes {
				t.Fatalf("the first attempt closed reverse_proxy's body %d times, want %d", src.closes, tc.closes)
			}
			if tc.closes > 0 {
				return // the body is gone; reverse_proxy retries no more
			}
			if n, err := a.Read(make([]byte, 16)); tc.first < 5 && (n != 0 || err != http.ErrBodyReadAfterClose) {
				t.Fatalf("a read of the closed attempt: %d, %v", n, err)
			}
			b, err := keptBodyFor(req)
			if err != nil {
				t.Fatal(err)
			}
			if got, err := io.ReadAll(b); err != nil || string(got) != "hello" {
				t.Fatalf("the next attempt sent %q, %v; want the whole body", got, err)
			}
		})
	}
}

// TestSlowBodyIsNotAWait: a client that takes longer than the wait timeout
// to send its short body, which the transport reads before it takes a
// connection, is served: the time was the client's, not a wait for a
// connection, and is not refused as one.
func TestSlowBodyIsNotAWait(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "got %s", b)
	}), false)
	port := freePort(t)
	startCaddy(t, "wait_timeout 200ms", site(port, up.hostport(), "", ""))
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "POST / HTTP/1.1\r\nHost: localhost\r\nContent-Length: 5\r\n\r\n")
	time.Sleep(600 * time.Millisecond)
	io.WriteString(c, "hello")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != "got hello" {
		t.Fatalf("a body sent 600ms after its head, under a 200ms wait timeout: %d %q", resp.StatusCode, b)
	}
}
