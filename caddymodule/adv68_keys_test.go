package caddymodule

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv68MoreUpstreamsThanKeys: the table tracks `keys` upstreams at
// once. With more upstreams than that (a dynamic upstream, SRV records,
// one reverse_proxy per backend), each holding only an idle connection, a
// request to one more upstream must still be served, as by the stock
// transport, which has no such limit: it goes on a connection of its own,
// outside the table (see proxy.Transport.unpooled).
func TestAdv68MoreUpstreamsThanKeys(t *testing.T) {
	const n = 6
	var ups []*upstream
	for i := 0; i < n; i++ {
		i := i
		ups = append(ups, newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			fmt.Fprintf(w, "up%d", i)
		}), false))
	}
	stockPort, orbitPort := headerRoutedSites(t, "keys 4")
	for _, v := range bothSites(stockPort, orbitPort) {
		t.Run(v.name, func(t *testing.T) {
			var bad []string
			for round := 0; round < 2; round++ {
				for i, u := range ups {
					req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", v.port), nil)
					req.Header.Set("X-Up", u.hostport())
					resp, err := client.Do(req)
					if err != nil {
						bad = append(bad, fmt.Sprintf("round %d up%d: %v", round, i, err))
						continue
					}
					b, _ := io.ReadAll(resp.Body)
					resp.Body.Close()
					if resp.StatusCode != 200 || string(b) != fmt.Sprintf("up%d", i) {
						bad = append(bad, fmt.Sprintf("round %d up%d: %d %q", round, i, resp.StatusCode, b))
					}
				}
			}
			if len(bad) > 0 {
				t.Errorf("%d of %d requests failed:\n%s", len(bad), 2*n, strings.Join(bad, "\n"))
			}
		})
	}
}

// TestAdv68MoreUpstreamsThanDefaultKeys: the same with the default table
// (1024 keys): 1030 upstreams, each asked once within the idle timeout.
// Every one of them answers through the stock transport.
func TestAdv68MoreUpstreamsThanDefaultKeys(t *testing.T) {
	const n = 1030
	var addrs []string
	for i := 0; i < n; i++ {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, "ok")
		})}
		go srv.Serve(ln)
		t.Cleanup(func() { srv.Close() })
		addrs = append(addrs, ln.Addr().String())
	}
	stockPort, orbitPort := headerRoutedSites(t, "")
	for _, v := range bothSites(stockPort, orbitPort) {
		t.Run(v.name, func(t *testing.T) {
			c := &http.Client{Timeout: 5 * time.Second}
			defer c.CloseIdleConnections()
			failed, first := 0, ""
			for _, a := range addrs {
				req, _ := http.NewRequest("GET", fmt.Sprintf("http://127.0.0.1:%d/", v.port), nil)
				req.Header.Set("X-Up", a)
				resp, err := c.Do(req)
				if err != nil {
					if failed == 0 {
						first = fmt.Sprintf("%s: %v", a, err)
					}
					failed++
					continue
				}
				io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode != 200 {
					if failed == 0 {
						first = fmt.Sprintf("%s: %d", a, resp.StatusCode)
					}
					failed++
				}
			}
			if failed > 0 {
				t.Errorf("%d of %d upstreams failed (first %s)", failed, n, first)
			}
		})
	}
}

// headerRoutedSites starts Caddy, with the orbit_pool app's options opts,
// serving two sites that proxy to the upstream the request's X-Up header
// names: one through the stock transport, one through orbit_pool.
func headerRoutedSites(t *testing.T, opts string) (stockPort, orbitPort int) {
	stockPort, orbitPort = freePort(t), freePort(t)
	startCaddy(t, opts, fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy {http.request.header.X-Up} {
		transport http
	}
}
:%d {
	bind 127.0.0.1
	reverse_proxy {http.request.header.X-Up} {
		transport orbit_pool
	}
}
`, stockPort, orbitPort))
	return stockPort, orbitPort
}
