package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// adv77bHow are the ways an owner leaves: Close at once, Shutdown draining
// (2s), and Close followed by the pool's Close (a process that stops).
var adv77bHow = []string{"close", "shutdown", "closepool"}

// adv77bLeave makes owner leave the fleet as how says.
func adv77bLeave(owner *member, how string) {
	switch how {
	case "close":
		owner.node.Close()
	case "shutdown":
		owner.leave("shutdown")
	case "closepool":
		owner.node.Close()
		owner.pool.Close()
	}
}

// adv77bResult is what a client got: status, body and error.
type adv77bResult struct {
	status int
	body   string
	cl     int64
	err    error
}

func (r adv77bResult) String() string {
	if r.err != nil {
		return fmt.Sprintf("error %v", r.err)
	}
	return fmt.Sprintf("%d %q (len %d)", r.status, r.body, r.cl)
}

// adv77bDo sends method to url (with body, may be nil, and hdr) within d
// and reads the whole response.
func adv77bDo(rt http.RoundTripper, method, url string, body io.Reader, size int64, hdr http.Header, d time.Duration) adv77bResult {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return adv77bResult{err: err}
	}
	if size > 0 {
		req.ContentLength = size
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		return adv77bResult{err: err}
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	return adv77bResult{status: resp.StatusCode, body: string(b), cl: resp.ContentLength, err: err}
}

// adv77bSame fails t unless got is what net/http gave (want).
func adv77bSame(t *testing.T, what string, got, want adv77bResult) {
	t.Helper()
	if want.err != nil {
		t.Fatalf("%s: the reference net/http.Transport failed: %v", what, want.err)
	}
	if got.err != nil || got.status != want.status || got.body != want.body || got.cl != want.cl {
		t.Errorf("%s: got %v, net/http.Transport got %v", what, got, want)
	}
}

// adv77bClearErr reports whether err is one of the package's documented
// failures (an *Error), not a wrong answer or an unexplained one.
func adv77bClearErr(err error) bool {
	var pe *Error
	return errors.As(err, &pe) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled)
}

// adv77bEvil is the marker every stray byte an upstream sends carries.
const adv77bEvil = "EVIL"

// adv77bScript answers a misbehaving upstream's paths:
//
//	/stray     "ok" and a second response in the same write
//	/straylate "ok", then a second response 20ms later
//	/garbage   "ok" and garbage bytes
//	/head      a HEAD's head with a length, then that many bytes
//	/204       a 204, then a response
//	/big       64 KiB (full TLS records) then a response
//	/bogus101  a 101 without Upgrade, then a response
//	/refuse    a refused upgrade (200 "no") then a response
//	/early413  413 Connection: close before reading the body
//	/early200  200 before reading the body, then close
//	/held      a chunked body held until release is closed
//	/          "ok"
func adv77bScript(release <-chan struct{}, strayOut func()) adv10Answer {
	evil := "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n" + adv77bEvil
	return func(c net.Conn, br *bufio.Reader, req *http.Request, conn, n int) bool {
		switch req.URL.Path {
		case "/early413", "/early200":
			if req.URL.Path == "/early413" {
				io.WriteString(c, "HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 4\r\n\r\nbig!")
			} else {
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nearly")
			}
			// Lingering close: read what the client still sends, for a
			// while, so that no reset overtakes the answer.
			c.SetReadDeadline(time.Now().Add(time.Second))
			io.Copy(io.Discard, br)
			return false
		}
		io.Copy(io.Discard, req.Body)
		switch req.URL.Path {
		case "/stray":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"+evil)
		case "/straylate":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			time.Sleep(20 * time.Millisecond)
			io.WriteString(c, evil)
			strayOut()
		case "/garbage":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"+adv77bEvil+"\x00\xff garbage\r\n\r\n")
		case "/head":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\n"+adv77bEvil)
		case "/204":
			io.WriteString(c, "HTTP/1.1 204 No Content\r\n\r\n"+evil)
		case "/big":
			b := strings.Repeat("b", 64<<10)
			io.WriteString(c, fmt.Sprintf("HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s%s", len(b), b, evil))
		case "/bogus101":
			io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\n\r\n"+evil)
		case "/refuse":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nno"+evil)
		case "/held":
			io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
			select {
			case <-release:
			case <-time.After(10 * time.Second):
			}
			io.WriteString(c, "4\r\nlast\r\n0\r\n\r\n")
		default:
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}
		return true
	}
}

// adv77bRelease is a release channel closed once, also at cleanup.
func adv77bRelease(t *testing.T) (chan struct{}, func()) {
	ch := make(chan struct{})
	var once sync.Once
	f := func() { once.Do(func() { close(ch) }) }
	t.Cleanup(f)
	return ch, f
}

// adv77bRef is net/http's Transport for u with keep-alives off: the
// reference answer for each request, on a connection of its own. With
// keep-alives net/http itself may read a stray response as the next
// request's (it puts a connection back idle before its read loop peeks at
// it; seen under -race here), which is not the answer to compare against.
func adv77bRef(t *testing.T, u *adv10Upstream) *http.Transport {
	tr := u.refTransport(t)
	tr.DisableKeepAlives = true
	return tr
}
