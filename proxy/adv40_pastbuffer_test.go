package proxy

import (
	"bufio"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
	"time"
)

// TestAdv40PastBufferBoundaries: heads whose end (CRLF CRLF) falls at every
// offset around the read buffer's size and maxHeadAhead, split into two
// writes at every offset around the end, with a short body or none, with
// Content-Length spelled in ways net/http accepts, and the next frame's
// bytes pipelined right behind: the request is read whole, and what
// follows it comes next, in order.
func TestAdv40PastBufferBoundaries(t *testing.T) {
	const next = "NEXT-FRAME"
	cls := []string{"Content-Length: %d\r\n", "content-length:%d \r\n", "Content-Length: %d\r\nContent-Length: %d\r\n", "Content-Length: 0%d\r\n"}
	var ends []int
	for _, at := range []int{readBufSize, maxHeadAhead} {
		for d := -5; d <= 5; d++ {
			ends = append(ends, at+d)
		}
	}
	for _, end := range ends {
		for _, body := range []int{0, 1, 4096} {
			for ci, cl := range cls {
				var clLine string
				if strings.Count(cl, "%d") == 2 {
					clLine = fmt.Sprintf(cl, body, body)
				} else {
					clLine = fmt.Sprintf(cl, body)
				}
				pre := "POST /x HTTP/1.1\r\nHost: x\r\n" + clLine + "Cookie: "
				cookie := end - len(pre) - len("\r\n\r\n")
				head := pre + strings.Repeat("c", cookie) + "\r\n\r\n"
				if len(head) != end {
					t.Fatalf("head %d, want %d", len(head), end)
				}
				msg := head + strings.Repeat("b", body) + next
				for _, split := range []int{0, end - 4, end - 3, end - 2, end - 1, end, end + 1, readBufSize, maxHeadAhead} {
					name := fmt.Sprintf("end=%d/body=%d/cl=%d/split=%d", end, body, ci, split)
					a, b := unixPair(t)
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
					if len(lr.ahead) > 0 && len(lr.ahead)+br.Buffered() > len(head)+body {
						t.Fatalf("%s: %d bytes read before the head was parsed, past the request's %d", name, len(lr.ahead)+br.Buffered(), len(head)+body)
					}
					req, err := readPeerHead(b, lr, br, time.Now().Add(2*time.Second), defaultMaxHeaderBytes)
					if err != nil {
						t.Fatalf("%s: head: %v", name, err)
					}
					got, err := io.ReadAll(req.Body)
					if err != nil || len(got) != body || len(req.Header.Get("Cookie")) != cookie {
						t.Fatalf("%s: body %d bytes (%v), cookie %d", name, len(got), err, len(req.Header.Get("Cookie")))
					}
					if len(lr.ahead) != 0 {
						t.Fatalf("%s: %d bytes past the request left ahead: %q", name, len(lr.ahead), lr.ahead)
					}
					rest := make([]byte, len(next))
					b.SetReadDeadline(time.Now().Add(2 * time.Second))
					if _, err := io.ReadFull(br, rest); err != nil || string(rest) != next {
						t.Fatalf("%s: what follows the request: %q (%v), want %s", name, rest, err, next)
					}
					a.Close()
					b.Close()
				}
			}
		}
	}
}
