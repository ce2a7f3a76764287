package proxy

import (
	"fmt"
	"strings"
	"testing"
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
					readsExactly(t, name, msg, next, split, body, cookie)
				}
			}
		}
	}
}
