package caddymodule

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// adv8RawUpstream serves every connection with serve, until the test ends.
func adv8RawUpstream(t *testing.T, serve func(c net.Conn, br *bufio.Reader)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	return serveRaw(t, ln, serve)
}

// serveRaw serves every connection ln accepts with serve, until the test
// ends, and returns ln's address.
func serveRaw(t *testing.T, ln net.Listener, serve func(c net.Conn, br *bufio.Reader)) string {
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
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
				c.SetDeadline(time.Now().Add(5 * time.Second))
				serve(c, bufio.NewReader(c))
			}()
		}
	}()
	return ln.Addr().String()
}

// readHead reads a request head off br.
func readHead(br *bufio.Reader) (*http.Request, error) {
	req, err := http.ReadRequest(br)
	if err != nil {
		return nil, err
	}
	io.Copy(io.Discard, req.Body)
	return req, nil
}

// TestAdv8ErrorStatuses: each way an upstream can fail gives the client
// the status (and body prefix) stock gives it.
func TestAdv8ErrorStatuses(t *testing.T) {
	closed := func() string {
		ln, _ := net.Listen("tcp", "127.0.0.1:0")
		a := ln.Addr().String()
		ln.Close()
		return a
	}
	for _, tc := range []struct {
		name  string
		opts  string // both transports
		serve func(c net.Conn, br *bufio.Reader)
	}{
		{"refused", "", nil},
		{"close-at-once", "", func(c net.Conn, br *bufio.Reader) {}},
		{"close-after-request", "", func(c net.Conn, br *bufio.Reader) { readHead(br) }},
		{"garbage", "", func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			io.WriteString(c, "HELLO THERE\r\n\r\n")
		}},
		{"bad-content-length", "", func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!")
		}},
		{"short-body", "", func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nonly this")
		}},
		{"close-delimited", "", func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\n\r\nall of it until close")
		}},
		{"http10-response", "", func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			io.WriteString(c, "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}},
		{"header-timeout", "response_header_timeout 100ms", func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			time.Sleep(400 * time.Millisecond)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}},
		{"huge-header", "max_response_header 1KiB", func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			io.WriteString(c, "HTTP/1.1 200 OK\r\nX-Big: "+strings.Repeat("a", 4096)+"\r\nContent-Length: 2\r\n\r\nok")
		}},
		{"many-1xx", "max_response_header 1KiB", func(c net.Conn, br *bufio.Reader) {
			readHead(br)
			for range 200 {
				if _, err := io.WriteString(c, "HTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n"); err != nil {
					return
				}
			}
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr := closed()
			if tc.serve != nil {
				addr = adv8RawUpstream(t, tc.serve)
			}
			stockOpts := ""
			if tc.opts != "" {
				stockOpts = "transport http {\n\t\t\t" + tc.opts + "\n\t\t}"
			}
			stock, orbit := freePort(t), freePort(t)
			startCaddy(t, "", fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		%s
	}
}
:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport orbit_pool {
			%s
		}
	}
}
`, stock, addr, stockOpts, orbit, addr, tc.opts))
			got := map[string]string{}
			for name, port := range map[string]int{"stock": stock, "orbit": orbit} {
				resp, err := client.Get(fmt.Sprintf("http://127.0.0.1:%d/", port))
				if err != nil {
					got[name] = "client error"
					continue
				}
				b, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				got[name] = fmt.Sprintf("%d %q %v", resp.StatusCode, b, err != nil)
			}
			if got["stock"] != got["orbit"] {
				t.Fatalf("stock: %s; orbit_pool: %s", got["stock"], got["orbit"])
			}
		})
	}
}
