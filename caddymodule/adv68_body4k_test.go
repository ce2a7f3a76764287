package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestAdv68SmallBodyRetriedAfterDialError: a POST whose first upstream
// refuses the dial is sent to the next upstream by reverse_proxy's
// lb_retries with its whole body, as through the stock transport (whose
// reverse_proxy keeps a body the transport did not read). orbit_pool
// reads a body of at most 4 KiB ahead, in one Read, and keeps it, which
// may return only part of the body (the head and body did not fit the
// server's 4 KiB read buffer together: a 4095-byte body, or a 3000-byte
// one under a 1200-byte cookie): the failed attempt must not close
// reverse_proxy's body then, or the retry fails with 502 "proxy: write:
// http: invalid Read on closed Body".
func TestAdv68SmallBodyRetriedAfterDialError(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		fmt.Fprintf(w, "%d %v", len(b), err)
	}), false)
	dead := freePort(t)
	stock, orbit := freePort(t), freePort(t)
	// Round robin over the dead and the live upstream, with no health
	// state: every other request tries the dead one first, then the live
	// one, so each body is sent twice.
	retry := "lb_policy round_robin\n\t\tlb_retries 1"
	startCaddy(t, "", fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:%d %s {
		transport http
		%s
	}
}
:%d {
	bind 127.0.0.1
	reverse_proxy 127.0.0.1:%d %s {
		transport orbit_pool
		%s
	}
}
`, stock, dead, up.hostport(), retry, orbit, dead, up.hostport(), retry))
	// The second column is the size of a Cookie header: with ordinary
	// headers, bodies from about 3 KiB up are read ahead only in part.
	for _, c := range [][2]int{{1000, 0}, {3900, 0}, {4095, 0}, {4096, 0}, {4097, 0}, {8192, 0}, {3000, 1200}, {2000, 1200}} {
		size, cookie := c[0], c[1]
		for _, v := range bothSites(stock, orbit) {
			for i := 0; i < 2; i++ {
				got := adv68PostCookie(fmt.Sprintf("http://127.0.0.1:%d/", v.port), strings.Repeat("q", size), cookie)
				if want := fmt.Sprintf("200 %d <nil>", size); got != want {
					t.Errorf("%s, body of %d, cookie of %d, request %d: %s, want %s", v.name, size, cookie, i, got, want)
				}
			}
		}
	}
}

// adv68PostCookie POSTs body with a Cookie header of cookie bytes (none
// for 0) on a fresh connection.
func adv68PostCookie(url, body string, cookie int) string {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	if cookie > 0 {
		req.Header.Set("Cookie", "s="+strings.Repeat("c", cookie-2))
	}
	resp, err := c.Do(req)
	if err != nil {
		return "error: " + err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return fmt.Sprintf("%d %s", resp.StatusCode, b)
}
