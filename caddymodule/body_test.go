package caddymodule

import (
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/modules/caddyhttp"
)

// pieces returns its parts one per Read, then io.EOF, and counts Closes.
type pieces struct {
	parts  []string
	closes int
}

func (p *pieces) Read(b []byte) (int, error) {
	if len(p.parts) == 0 {
		return 0, io.EOF
	}
	n := copy(b, p.parts[0])
	p.parts[0] = p.parts[0][n:]
	if p.parts[0] == "" {
		p.parts = p.parts[1:]
	}
	return n, nil
}

func (p *pieces) Close() error { p.closes++; return nil }

func keptRequest(t *testing.T, body io.ReadCloser, n int64) *http.Request {
	ctx := context.WithValue(context.Background(), caddyhttp.VarsCtxKey, map[string]any{})
	req, err := http.NewRequestWithContext(ctx, "POST", "http://upstream.test/", body)
	if err != nil {
		t.Fatal(err)
	}
	req.ContentLength = n
	return req
}

// TestKeptBodyAcrossAttempts: reverse_proxy sends the same request, with the
// same body, to the next upstream after a dial error. What the transport
// read of a short body on the first attempt (all of it, or the first part)
// is sent again on the next, then the rest; a body read to its end is not
// closed by an attempt, for the next to send it from what was kept.
func TestKeptBodyAcrossAttempts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		parts []string
		first int // bytes the first attempt reads
	}{
		{"whole", []string{"hello"}, 5},
		{"part", []string{"he", "llo"}, 2},
		{"none", []string{"hello"}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			src := &pieces{parts: tc.parts}
			req := keptRequest(t, src, 5)
			a := keptBodyFor(req)
			if tc.first > 0 {
				buf := make([]byte, 16)
				if n, _ := io.ReadAtLeast(a, buf, tc.first); n != tc.first {
					t.Fatalf("first attempt read %d bytes", n)
				}
				if tc.first == 5 {
					// The transport reads on to see the end.
					if n, err := a.Read(buf); n != 0 || err != io.EOF {
						t.Fatalf("after the body: %d, %v", n, err)
					}
				}
			}
			a.Close()
			if tc.first == 5 && src.closes != 0 {
				t.Fatal("an attempt closed a body it had read to its end, which the next attempt needs")
			}
			got, err := io.ReadAll(keptBodyFor(req))
			if err != nil || string(got) != "hello" {
				t.Fatalf("the next attempt sent %q, %v; want the whole body", got, err)
			}
		})
	}
}

// TestKeptBodyOnlyShort: a body longer than the transport ever reads ahead,
// or of unknown length, goes as it is.
func TestKeptBodyOnlyShort(t *testing.T) {
	for _, n := range []int64{maxKeptBody + 1, -1} {
		src := io.NopCloser(strings.NewReader("x"))
		req := keptRequest(t, src, n)
		if b := keptBodyFor(req); b != src {
			t.Fatalf("Content-Length %d: body wrapped as %T", n, b)
		}
	}
}
