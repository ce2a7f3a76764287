package proxy

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"testing"
	"time"
)

// TestAdv38PastBufferReadsExactly: what awaitHead reads past its full
// buffer is exactly the head and the short body: bytes a peer pipelined
// after them stay in the stream, in order, for the next frame, whatever
// the sizes and however the bytes are split into writes.
func TestAdv38PastBufferReadsExactly(t *testing.T) {
	for _, cookie := range []int{0, 3000, 4090, 6000, 20000} {
		for _, body := range []int{0, 1, 4095, 4096} {
			for _, split := range []int{0, 1, 7, 4093, 4100} {
				name := fmt.Sprintf("cookie=%d/body=%d/split=%d", cookie, body, split)
				head := "POST /x HTTP/1.1\r\nHost: x\r\n"
				if cookie > 0 {
					head += "Cookie: " + strings.Repeat("c", cookie) + "\r\n"
				}
				head += fmt.Sprintf("Content-Length: %d\r\n\r\n", body)
				msg := head + strings.Repeat("b", body) + "NEXT-FRAME"
				readsExactly(t, name, msg, "NEXT-FRAME", split, body, cookie)
			}
		}
	}
}

// readsExactly sends msg, a request with a body of body bytes and a cookie
// of cookie bytes followed by next, in two writes split at split (one if 0
// or past its end), and checks that awaitHead reads no further than the
// request, and that the head's parse then takes it whole and leaves next to
// come, in order.
func readsExactly(t *testing.T, name, msg, next string, split, body, cookie int) {
	t.Helper()
	a, b := unixPair(t)
	defer a.Close()
	defer b.Close()
	go func() {
		if split > 0 && split < len(msg) {
			a.Write([]byte(msg[:split]))
			time.Sleep(2 * time.Millisecond)
			a.Write([]byte(msg[split:]))
		} else {
			a.Write([]byte(msg))
		}
	}()
	cr := &bgReader{nc: b}
	cr.cond.L = &cr.mu
	lr := &limitReader{r: cr, n: math.MaxInt64}
	br := bufio.NewReaderSize(lr, readBufSize)
	if err := awaitHead(b, lr, br, time.Now().Add(2*time.Second), body > 0); err != nil {
		t.Fatalf("%s: awaitHead: %v", name, err)
	}
	if n := len(msg) - len(next); len(lr.ahead) > 0 && len(lr.ahead)+br.Buffered() > n {
		t.Fatalf("%s: %d bytes read before the head was parsed, past the request's %d", name, len(lr.ahead)+br.Buffered(), n)
	}
	req, err := readPeerHead(b, lr, br, time.Now().Add(2*time.Second), defaultMaxHeaderBytes)
	if err != nil {
		t.Fatalf("%s: head: %v", name, err)
	}
	got, err := io.ReadAll(req.Body)
	if err != nil || len(got) != body || len(req.Header.Get("Cookie")) != cookie {
		t.Fatalf("%s: body %d bytes (%v), cookie %d", name, len(got), err, len(req.Header.Get("Cookie")))
	}
	// Nothing past the request waits ahead of the stream, which the
	// exchange's watch reads itself.
	if len(lr.ahead) != 0 {
		t.Fatalf("%s: %d bytes past the request left ahead: %q", name, len(lr.ahead), lr.ahead)
	}
	rest := make([]byte, len(next))
	b.SetReadDeadline(time.Now().Add(2 * time.Second))
	if _, err := io.ReadFull(br, rest); err != nil || string(rest) != next {
		t.Fatalf("%s: what follows the request: %q (%v), want %s", name, rest, err, next)
	}
}

func unixPair(t *testing.T) (net.Conn, net.Conn) {
	t.Helper()
	dir := t.TempDir()
	ln, err := net.Listen("unix", dir+"/s")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	a, err := net.Dial("unix", dir+"/s")
	if err != nil {
		t.Fatal(err)
	}
	b, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
