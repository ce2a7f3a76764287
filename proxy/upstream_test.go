package proxy

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// testUpstream is an HTTP/1.1 server with one behaviour per path, plus a raw
// TCP server for what net/http's server will not produce (close-delimited
// bodies, HTTP/1.0, odd reason phrases, malformed and oversized heads).
type testUpstream struct {
	srv *httptest.Server
	raw net.Listener

	mu    sync.Mutex
	gates map[string]chan struct{}
}

func newTestUpstream(t testing.TB) *testUpstream {
	u := &testUpstream{gates: make(map[string]chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(u.serve))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	u.raw = ln
	go u.serveRaw()
	t.Cleanup(func() {
		u.srv.CloseClientConnections()
		u.srv.Close()
		ln.Close()
	})
	return u
}

func (u *testUpstream) url(path string) string { return u.srv.URL + path }

func (u *testUpstream) rawURL(path string) string { return "http://" + u.raw.Addr().String() + path }

// gate returns the channel a streaming handler waits on between chunks.
func (u *testUpstream) gate(id string) chan struct{} {
	u.mu.Lock()
	defer u.mu.Unlock()
	g, ok := u.gates[id]
	if !ok {
		g = make(chan struct{}, 16)
		u.gates[id] = g
	}
	return g
}

const fixedDate = "Mon, 02 Jan 2006 15:04:05 GMT"

func (u *testUpstream) serve(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Date", fixedDate)
	h.Add("X-Multi", "a")
	h.Add("X-Multi", "b")
	switch r.URL.Path {
	case "/cl":
		h.Set("Content-Length", "11")
		io.WriteString(w, "hello world")
	case "/empty":
		h.Set("Content-Length", "0")
	case "/chunked":
		io.WriteString(w, "part one,")
		w.(http.Flusher).Flush()
		io.WriteString(w, "part two")
	case "/trailers":
		h.Set("Trailer", "X-Sum, X-Count")
		io.WriteString(w, "body with trailers")
		w.(http.Flusher).Flush()
		h.Set("X-Sum", "42")
		h.Set("X-Count", "1")
		h.Set(http.TrailerPrefix+"X-Late", "undeclared")
	case "/echo":
		u.echo(w, r)
	case "/head":
		h.Set("Content-Length", "1234")
		if r.Method != http.MethodHead {
			io.WriteString(w, strings.Repeat("x", 1234))
		}
	case "/204":
		w.WriteHeader(http.StatusNoContent)
	case "/304":
		h.Set("ETag", `"v1"`)
		w.WriteHeader(http.StatusNotModified)
	case "/1xx":
		h.Set("Link", "</a.css>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		h.Set("Link", "</b.js>; rel=preload")
		w.WriteHeader(http.StatusEarlyHints)
		h.Del("Link")
		io.WriteString(w, "after hints")
	case "/expect-reject":
		h.Set("Connection", "close")
		w.WriteHeader(http.StatusExpectationFailed)
		io.WriteString(w, "no body wanted")
	case "/stream":
		g := u.gate(r.URL.Query().Get("id"))
		for i := range 3 {
			fmt.Fprintf(w, "chunk-%d;", i)
			w.(http.Flusher).Flush()
			if i < 2 {
				select {
				case <-g:
				case <-r.Context().Done():
					return
				case <-time.After(5 * time.Second):
					return
				}
			}
		}
	case "/big":
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		if r.URL.Query().Get("cl") == "1" {
			h.Set("Content-Length", strconv.Itoa(n))
		}
		writePattern(w, int64(n))
	case "/gzip":
		if !strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
			io.WriteString(w, "plain hello")
			return
		}
		var zb bytes.Buffer
		zw := gzip.NewWriter(&zb)
		io.WriteString(zw, "compressed hello, compressed hello")
		zw.Close()
		h.Set("Content-Encoding", "gzip")
		h.Set("Content-Length", strconv.Itoa(zb.Len()))
		w.Write(zb.Bytes())
	case "/sink":
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			w.WriteHeader(500)
		}
		fmt.Fprintf(w, "%d", n)
	case "/stall":
		w.WriteHeader(200)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	case "/stall-cl":
		// A declared 4 MiB, of which 1 MiB comes at once and the rest
		// never, until the client goes.
		h.Set("Content-Length", strconv.Itoa(4<<20))
		writePattern(w, 1<<20)
		w.(http.Flusher).Flush()
		select {
		case <-r.Context().Done():
		case <-time.After(10 * time.Second):
		}
	case "/slow":
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		time.Sleep(time.Duration(max(ms, 2)) * time.Millisecond)
		io.WriteString(w, "ok")
	case "/upgrade":
		if r.Header.Get("Upgrade") != "echo" {
			w.WriteHeader(400)
			return
		}
		c, brw, err := w.(http.Hijacker).Hijack()
		if err != nil {
			return
		}
		defer c.Close()
		io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		io.Copy(c, brw)
		io.WriteString(c, "|bye")
	default:
		w.WriteHeader(404)
	}
}

// echo describes the request as the upstream saw it.
func (u *testUpstream) echo(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(500)
		return
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s %s host=%s cl=%d te=%v close=%v\n", r.Method, r.RequestURI, r.Proto, r.Host, r.ContentLength, r.TransferEncoding, r.Close)
	keys := make([]string, 0, len(r.Header))
	for k := range r.Header {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		fmt.Fprintf(&b, "%s: %q\n", k, r.Header[k])
	}
	fmt.Fprintf(&b, "body=%q\n", body)
	tk := make([]string, 0, len(r.Trailer))
	for k := range r.Trailer {
		tk = append(tk, k)
	}
	sort.Strings(tk)
	for _, k := range tk {
		fmt.Fprintf(&b, "trailer %s: %q\n", k, r.Trailer[k])
	}
	io.WriteString(w, b.String())
}

func writePattern(w io.Writer, n int64) {
	buf := make([]byte, 32<<10)
	for i := range buf {
		buf[i] = byte('a' + i%26)
	}
	for n > 0 {
		k := min(n, int64(len(buf)))
		if _, err := w.Write(buf[:k]); err != nil {
			return
		}
		n -= k
	}
}

// serveRaw answers each request with a scripted response and closes.
func (u *testUpstream) serveRaw() {
	for {
		c, err := u.raw.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			for n := 1; ; n++ {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				io.Copy(io.Discard, req.Body)
				if req.URL.Path == "/once-per-conn" && n > 1 {
					// An upstream timing out an idle connection just as a
					// request arrives: closed, nothing answered.
					return
				}
				if !rawResponse(c, req) {
					return
				}
			}
		}()
	}
}

// rawResponse writes the scripted response for req and reports whether the
// connection stays open.
func rawResponse(c net.Conn, req *http.Request) bool {
	w := func(s string) { io.WriteString(c, s) }
	switch req.URL.Path {
	case "/close-delimited":
		w("HTTP/1.1 200 OK\r\nX-Kind: eof\r\n\r\nread until the connection closes")
		return false
	case "/http10":
		w("HTTP/1.0 200 OK\r\nContent-Length: 5\r\n\r\nhello")
		return false
	case "/http10-eof":
		w("HTTP/1.0 200 OK\r\n\r\nten-body")
		return false
	case "/reason":
		w("HTTP/1.1 299 Quite Fine Indeed\r\nContent-Length: 2\r\n\r\nok")
	case "/extra-bytes":
		// A response, and in the same write one nobody asked for: the
		// connection must not carry another exchange.
		w("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok" +
			"HTTP/1.1 200 OK\r\nContent-Length: 22\r\n\r\nSMUGGLED-FROM-PREVIOUS")
	case "/no-reason":
		w("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n")
	case "/trailing-space":
		w("HTTP/1.1 404 \r\nContent-Length: 0\r\n\r\n")
	case "/cl-close":
		w("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nbye")
		return false
	case "/malformed":
		w("HTTP/1.1 abc nonsense\r\n\r\n")
		return false
	case "/garbage":
		w("this is not http at all\r\n\r\n")
		return false
	case "/huge-header":
		w("HTTP/1.1 200 OK\r\nX-Big: " + strings.Repeat("h", 64<<10) + "\r\nContent-Length: 0\r\n\r\n")
	case "/truncated":
		w("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly a part")
		return false
	case "/truncated-chunked":
		w("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n")
		return false
	case "/100-then-200":
		w("HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ndone")
	case "/head-chunked":
		w("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
	case "/once-per-conn":
		// Chunked, so that the body is not read with the head and the
		// exchange is still on when the response is returned.
		w("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nok\r\n0\r\n\r\n")
	case "/stall-head":
		time.Sleep(3 * time.Second)
		return false
	case "/keepalive-then-close":
		w("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		time.Sleep(20 * time.Millisecond)
		return false
	default:
		w("HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
	}
	return true
}
