package caddymodule

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// Adversarial review 8: the orbit_pool transport against the stock `http`
// transport, in one in-process Caddy with one site per transport proxying to
// the same upstream. Every case sends the same raw bytes to both and
// compares what the upstream saw and what the client got.

// adv8Seen is what an upstream handler saw of requests, by X-Case.
type adv8Seen struct {
	mu sync.Mutex
	m  map[string][]string
}

func (s *adv8Seen) add(c, v string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string][]string{}
	}
	s.m[c] = append(s.m[c], v)
}

func (s *adv8Seen) take(c string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	v := s.m[c]
	delete(s.m, c)
	return v
}

// adv8Headers renders h sorted, without the headers that differ between
// any two exchanges.
func adv8Headers(h http.Header, skip ...string) string {
	var keys []string
	for k := range h {
		if slices.Contains([]string{"Date", "Via", "Server"}, k) || slices.Contains(skip, k) {
			continue
		}
		keys = append(keys, k)
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		fmt.Fprintf(&b, "%s=%q ", k, h[k])
	}
	return b.String()
}

// adv8Upstream is an upstream that records every request it reads and
// answers as the request's X-Case asks.
func adv8Upstream(t *testing.T, seen *adv8Seen) *upstream {
	return newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c := r.Header.Get("X-Case")
		body, err := io.ReadAll(r.Body)
		seen.add(c, fmt.Sprintf("%s %s %s host=%q cl=%d te=%v hdr=[%s] body=%d:%.40q err=%v trailer=[%s]",
			r.Method, r.RequestURI, r.Proto, r.Host, r.ContentLength, r.TransferEncoding,
			adv8Headers(r.Header, "X-Forwarded-For"), len(body), body, err, adv8Headers(r.Trailer)))
		switch c {
		case "head":
			w.Header().Set("Content-Length", "123")
			w.Header().Set("X-Head", "yes")
		case "trailers":
			w.Header().Set("Trailer", "X-Sum")
			w.Write([]byte("part one,"))
			w.(http.Flusher).Flush()
			w.Write([]byte("part two"))
			w.Header().Set("X-Sum", "42")
			return
		case "early-hints":
			w.Header().Set("Link", "</style.css>; rel=preload")
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Set("X-Final", "1")
		case "204":
			w.WriteHeader(204)
			return
		case "304":
			w.Header().Set("ETag", `"x"`)
			w.WriteHeader(304)
			return
		case "multi":
			w.Header().Add("Set-Cookie", "a=1")
			w.Header().Add("Set-Cookie", "b=2")
		case "417":
			w.WriteHeader(417)
			return
		}
		fmt.Fprintf(w, "ok %s %d", c, len(body))
	}), false)
}

// adv8Exchange writes raw to port on a fresh connection and returns what
// the client read: every interim response, the final one and its body.
func adv8Exchange(t *testing.T, port int, raw string, head bool) string {
	t.Helper()
	c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.WriteString(c, raw); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(c)
	var out strings.Builder
	for {
		var req *http.Request
		if head {
			req, _ = http.NewRequest("HEAD", "/", nil)
		}
		resp, err := http.ReadResponse(br, req)
		if err != nil {
			fmt.Fprintf(&out, "read error: %v", err)
			return out.String()
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		line := fmt.Sprintf("%d hdr=[%s] body=%q err=%v trailer=[%s]\n", resp.StatusCode,
			adv8Headers(resp.Header), b, err, adv8Headers(resp.Trailer))
		// A 100 Continue may come twice, once from the server as the
		// body is first read and once relayed from the upstream, as
		// the timing falls: count it once.
		if resp.StatusCode != http.StatusContinue || !strings.Contains(out.String(), line) {
			out.WriteString(line)
		}
		if resp.StatusCode >= 200 || resp.StatusCode == 101 {
			return out.String()
		}
	}
}

// adv8Sites starts one Caddy with a stock site and an orbit_pool site, both
// proxying to hostport with extra in the reverse_proxy block, and returns
// their ports, stock first.
func adv8Sites(t *testing.T, hostport, transportOpts, extra string) (stock, orbit int) {
	t.Helper()
	stock, orbit = freePort(t), freePort(t)
	sites := fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport http
		%s
	}
}
:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport orbit_pool {
			%s
		}
		%s
	}
}
`, stock, hostport, extra, orbit, hostport, transportOpts, extra)
	startCaddy(t, "", sites)
	return stock, orbit
}

func TestAdv8Parity(t *testing.T) {
	var seen adv8Seen
	up := adv8Upstream(t, &seen)
	stock, orbit := adv8Sites(t, up.hostport(), "", "")
	big := strings.Repeat("0123456789abcdef", 4096) // 64 KiB
	chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }

	for _, tc := range []struct {
		name string
		raw  string
		head bool
	}{
		{"get", "GET /a%2Fb//c?x=1;y=%20 HTTP/1.1\r\nHost: example.test\r\nX-Case: get\r\nX-Multi: 1\r\nX-Multi: 2\r\nConnection: close\r\n\r\n", false},
		{"get-no-accept-encoding", "GET / HTTP/1.1\r\nHost: h\r\nX-Case: get-no-accept-encoding\r\nConnection: close\r\n\r\n", false},
		{"post-length", "POST /p HTTP/1.1\r\nHost: h\r\nX-Case: post-length\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", false},
		{"post-empty", "POST /p HTTP/1.1\r\nHost: h\r\nX-Case: post-empty\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", false},
		{"post-chunked", "POST /p HTTP/1.1\r\nHost: h\r\nX-Case: post-chunked\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
			chunk("abc") + chunk("defgh") + "0\r\n\r\n", false},
		{"post-chunked-big", "POST /p HTTP/1.1\r\nHost: h\r\nX-Case: post-chunked-big\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
			chunk(big) + chunk(big) + "0\r\n\r\n", false},
		{"post-length-big", "POST /p HTTP/1.1\r\nHost: h\r\nX-Case: post-length-big\r\nContent-Length: 65536\r\nConnection: close\r\n\r\n" + big, false},
		{"post-trailers", "POST /p HTTP/1.1\r\nHost: h\r\nX-Case: post-trailers\r\nTrailer: X-Check\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n" +
			chunk("abc") + "0\r\nX-Check: 7\r\n\r\n", false},
		{"expect", "POST /p HTTP/1.1\r\nHost: h\r\nX-Case: expect\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", false},
		{"expect-417", "POST /p HTTP/1.1\r\nHost: h\r\nX-Case: 417\r\nExpect: 100-continue\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello", false},
		{"head", "HEAD /h HTTP/1.1\r\nHost: h\r\nX-Case: head\r\nConnection: close\r\n\r\n", true},
		{"trailers", "GET /t HTTP/1.1\r\nHost: h\r\nX-Case: trailers\r\nTE: trailers\r\nConnection: close\r\n\r\n", false},
		{"early-hints", "GET /e HTTP/1.1\r\nHost: h\r\nX-Case: early-hints\r\nConnection: close\r\n\r\n", false},
		{"204", "GET /n HTTP/1.1\r\nHost: h\r\nX-Case: 204\r\nConnection: close\r\n\r\n", false},
		{"304", "GET /n HTTP/1.1\r\nHost: h\r\nX-Case: 304\r\nIf-None-Match: \"x\"\r\nConnection: close\r\n\r\n", false},
		{"multi", "GET /m HTTP/1.1\r\nHost: h\r\nX-Case: multi\r\nConnection: close\r\n\r\n", false},
		{"http10", "GET /old HTTP/1.0\r\nHost: h\r\nX-Case: http10\r\n\r\n", false},
		{"options-star", "OPTIONS * HTTP/1.1\r\nHost: h\r\nX-Case: options-star\r\nConnection: close\r\n\r\n", false},
		{"delete-body", "DELETE /d HTTP/1.1\r\nHost: h\r\nX-Case: delete-body\r\nContent-Length: 3\r\nConnection: close\r\n\r\nabc", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := strings.Split(strings.SplitN(tc.raw, "X-Case: ", 2)[1], "\r\n")[0]
			gotStock := adv8Exchange(t, stock, tc.raw, tc.head)
			upStock := seen.take(c)
			gotOrbit := adv8Exchange(t, orbit, tc.raw, tc.head)
			upOrbit := seen.take(c)
			if gotStock != gotOrbit {
				t.Errorf("client got\nstock: %s\norbit: %s", gotStock, gotOrbit)
			}
			if fmt.Sprint(upStock) != fmt.Sprint(upOrbit) {
				t.Errorf("upstream saw\nstock: %v\norbit: %v", upStock, upOrbit)
			}
		})
	}
}
