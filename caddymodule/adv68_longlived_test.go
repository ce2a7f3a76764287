package caddymodule

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// TestAdv68ManyLongLivedStreams: a site with more concurrent long-lived
// exchanges (WebSockets, server-sent events) than the app's default
// connections per process (conns_per_process, 1024) must still open them
// all and answer an ordinary request, as the stock transport does: a
// tunnel or an event stream that sits idle costs the upstream nothing.
func TestAdv68ManyLongLivedStreams(t *testing.T) {
	for _, kind := range []string{"websocket", "sse"} {
		t.Run(kind, func(t *testing.T) {
			const n = 1040
			addr := adv8RawUpstream(t, func(c net.Conn, br *bufio.Reader) {
				c.SetDeadline(time.Now().Add(60 * time.Second))
				req, err := readHead(br)
				if err != nil {
					return
				}
				switch req.URL.Path {
				case "/ws":
					io.WriteString(c, "HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
					io.Copy(c, br)
				case "/events":
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
					fmt.Fprintf(c, "%x\r\n%s\r\n", len("data: hi\n\n"), "data: hi\n\n")
					io.Copy(io.Discard, br) // until the proxy closes
				default:
					io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nplain")
				}
			})
			stock, orbit := adv8Sites(t, addr, "", "flush_interval -1")
			for _, v := range bothSites(stock, orbit) {
				t.Run(v.name, func(t *testing.T) {
					var conns []net.Conn
					defer func() {
						for _, c := range conns {
							c.Close()
						}
					}()
					for i := 0; i < n; i++ {
						c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", v.port))
						if err != nil {
							t.Fatal(err)
						}
						conns = append(conns, c)
						c.SetDeadline(time.Now().Add(10 * time.Second))
						if kind == "websocket" {
							io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: t\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n")
						} else {
							io.WriteString(c, "GET /events HTTP/1.1\r\nHost: t\r\n\r\n")
						}
					}
					// Every stream is open: its head came.
					opened, others := 0, map[string]int{}
					for _, c := range conns {
						resp, err := http.ReadResponse(bufio.NewReader(c), nil)
						switch {
						case err != nil:
							others[err.Error()]++
						case resp.StatusCode == 101 || resp.StatusCode == 200:
							opened++
						default:
							b, _ := io.ReadAll(io.LimitReader(resp.Body, 200))
							others[fmt.Sprintf("%d %s", resp.StatusCode, b)]++
						}
					}
					start := time.Now()
					req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/plain", v.port), nil)
					got := ""
					resp, err := (&http.Client{Timeout: 20 * time.Second}).Do(req)
					if err != nil {
						got = err.Error()
					} else {
						b, _ := io.ReadAll(resp.Body)
						resp.Body.Close()
						got = fmt.Sprintf("%d %s", resp.StatusCode, b)
					}
					took := time.Since(start)
					if opened != n || got != "200 plain" {
						t.Errorf("%d of %d streams opened (the others: %v); then a plain GET: %s after %s", opened, n, others, got, took.Round(time.Millisecond))
					}
				})
			}
		})
	}
}
