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
func outcomeOf(tr *Transport, rc lingerRequest, readBody bool) string {
	req, cancel := rc.build()
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

// lingerRequest describes a request of TestAdv3LingerErrorsMatchUncapped.
type lingerRequest struct {
	url         string
	post        bool          // with a 64 MiB body sent slowly
	cancelAfter time.Duration // 0: never cancelled
	timeout     time.Duration // 0: none
}

func (rc lingerRequest) build() (*http.Request, context.CancelFunc) {
	ctx, cancel := context.Background(), context.CancelFunc(func() {})
	switch {
	case rc.timeout > 0:
		ctx, cancel = context.WithTimeout(ctx, rc.timeout)
	case rc.cancelAfter > 0:
		ctx, cancel = context.WithCancel(ctx)
		time.AfterFunc(rc.cancelAfter, cancel)
	}
	method, body := "GET", io.Reader(nil)
	if rc.post {
		method, body = "POST", io.NopCloser(&slowReader{n: 64 << 20})
	}
	req, _ := http.NewRequestWithContext(ctx, method, rc.url, body)
	return req, cancel
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
		req      lingerRequest // its url is the upstream's
		readBody bool
	}{
		{"cancel-awaiting-head", silent, nil, lingerRequest{cancelAfter: 50 * time.Millisecond}, false},
		{"deadline-awaiting-head", silent, nil, lingerRequest{timeout: 300 * time.Millisecond}, false},
		{"header-timeout", silent, func(tr *Transport) { tr.ResponseHeaderTimeout = 50 * time.Millisecond }, lingerRequest{}, false},
		{"cancel-writing-body", deaf, nil, lingerRequest{post: true, cancelAfter: 100 * time.Millisecond}, false},
		{"early-answer-body-stalls", early, nil, lingerRequest{post: true}, true},
		{"cancel-reading-body", stream, nil, lingerRequest{cancelAfter: 100 * time.Millisecond}, true},
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
				rc := tc.req
				rc.url = url
				got[i] = outcomeOf(tr, rc, tc.readBody)
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
