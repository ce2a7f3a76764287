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
	"testing"
	"time"
)

type slowReader struct{ n int }

func (r *slowReader) Read(p []byte) (int, error) {
	if r.n <= 0 {
		return 0, io.EOF
	}
	k := min(len(p), r.n, 64<<10)
	clear(p[:k])
	r.n -= k
	return k, nil
}

// outcomeOf describes what a caller sees: RoundTrip's error, its retry
// safety, and what reading the body gave.
func outcomeOf(tr *Transport, build func() (*http.Request, context.CancelFunc), readBody bool) string {
	req, cancel := build()
	defer cancel()
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return fmt.Sprintf("rt err=%v retrysafe=%v canceled=%v deadline=%v", err, IsRetrySafe(err),
			errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded))
	}
	defer resp.Body.Close()
	s := fmt.Sprintf("status=%d", resp.StatusCode)
	if readBody {
		_, err := io.Copy(io.Discard, resp.Body)
		s += fmt.Sprintf(" body err=%v canceled=%v", err, errors.Is(err, context.Canceled))
	}
	return s
}

// TestAdv3LingerErrorsMatchUncapped: the errors a caller sees when an
// exchange is torn down are the same with a cap (the connection lingers)
// as without.
func TestAdv3LingerErrorsMatchUncapped(t *testing.T) {
	silent := func(c net.Conn, br *bufio.Reader, _ *http.Request) bool {
		io.Copy(io.Discard, br)
		return false
	}
	deaf := func(net.Conn, *bufio.Reader, *http.Request) bool { // reads the head, nothing of the body
		time.Sleep(3 * time.Second)
		return false
	}
	early := func(c net.Conn, _ *bufio.Reader, _ *http.Request) bool { // answers before reading the body
		io.WriteString(c, "HTTP/1.1 413 Too Large\r\nContent-Length: 2\r\n\r\nno")
		time.Sleep(3 * time.Second)
		return false
	}
	stream := func(c net.Conn, _ *bufio.Reader, _ *http.Request) bool {
		io.WriteString(c, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
		for range 100 {
			if _, err := io.WriteString(c, "5\r\nhello\r\n"); err != nil {
				return false
			}
			time.Sleep(5 * time.Millisecond)
		}
		return false
	}
	cases := []struct {
		name     string
		serve    func(net.Conn, *bufio.Reader, *http.Request) bool
		conf     func(*Transport)
		build    func(url string) func() (*http.Request, context.CancelFunc)
		readBody bool
	}{
		{"cancel-awaiting-head", silent, nil, func(url string) func() (*http.Request, context.CancelFunc) {
			return func() (*http.Request, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(50*time.Millisecond, cancel)
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				return req, cancel
			}
		}, false},
		{"deadline-awaiting-head", silent, nil, func(url string) func() (*http.Request, context.CancelFunc) {
			return func() (*http.Request, context.CancelFunc) {
				ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				return req, cancel
			}
		}, false},
		{"header-timeout", silent, func(tr *Transport) { tr.ResponseHeaderTimeout = 50 * time.Millisecond }, func(url string) func() (*http.Request, context.CancelFunc) {
			return func() (*http.Request, context.CancelFunc) {
				req, _ := http.NewRequest("GET", url, nil)
				return req, func() {}
			}
		}, false},
		{"cancel-writing-body", deaf, nil, func(url string) func() (*http.Request, context.CancelFunc) {
			return func() (*http.Request, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(100*time.Millisecond, cancel)
				req, _ := http.NewRequestWithContext(ctx, "POST", url, io.NopCloser(&slowReader{n: 64 << 20}))
				return req, cancel
			}
		}, false},
		{"early-answer-body-stalls", early, nil, func(url string) func() (*http.Request, context.CancelFunc) {
			return func() (*http.Request, context.CancelFunc) {
				req, _ := http.NewRequest("POST", url, io.NopCloser(&slowReader{n: 64 << 20}))
				return req, func() {}
			}
		}, true},
		{"cancel-reading-body", stream, nil, func(url string) func() (*http.Request, context.CancelFunc) {
			return func() (*http.Request, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				time.AfterFunc(100*time.Millisecond, cancel)
				req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
				return req, cancel
			}
		}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			url := rawUpstream(t, tc.serve) + "/"
			var got [2]string
			for i, cp := range []int{0, 1} {
				tr := localTransport(t, func(tr *Transport) {
					tr.MaxConnsPerKey = cp
					if tc.conf != nil {
						tc.conf(tr)
					}
				})
				got[i] = outcomeOf(tr, tc.build(url), tc.readBody)
				// the port part of an address differs; compare shapes
				got[i] = stripAddrs(got[i])
			}
			t.Logf("%s | %s", got[0], got[1])
			if got[0] != got[1] {
				t.Errorf("without a cap: %s\nwith a cap:    %s", got[0], got[1])
			}
		})
	}
}

func stripAddrs(s string) string {
	f := strings.Fields(s)
	for i, w := range f {
		if strings.Contains(w, "127.0.0.1:") {
			f[i] = "ADDR"
		}
	}
	return strings.Join(f, " ")
}
