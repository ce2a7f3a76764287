package scenario

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"time"

	"github.com/orbitproxy/orbit/integration/load"
	"github.com/orbitproxy/orbit/internal/grpcmsg"
	"golang.org/x/net/http2"
)

// grpcStreamsPerConn is how many calls each client connection of the grpc
// scenario keeps in flight at once.
const grpcStreamsPerConn = 4

// grpcUnary is gRPC-style load over h2c: conns client connections, each
// with grpcStreamsPerConn unary calls in flight (POST /grpc, one 5-byte
// prefixed message each way, grpc-status in the trailers), until d has
// passed. A call is OK when its message comes back whole with grpc-status 0.
func grpcUnary(ctx context.Context, addr string, conns int, d time.Duration) (load.Result, error) {
	res := load.Result{Errors: map[string]int{}, Status: map[int]int{}}
	var mu sync.Mutex
	var lat []time.Duration
	start := time.Now()
	deadline := start.Add(d)
	msg := grpcmsg.Frame([]byte("orbit-grpc-payload-0123456789abcdef"))
	var wg sync.WaitGroup
	for range conns {
		tr := &http2.Transport{
			AllowHTTP:                  true,
			StrictMaxConcurrentStreams: true,
			DialTLSContext: func(ctx context.Context, network, a string, _ *tls.Config) (net.Conn, error) {
				return (&net.Dialer{}).DialContext(ctx, network, a)
			},
		}
		defer tr.CloseIdleConnections()
		c := &http.Client{Transport: tr, Timeout: 10 * time.Second}
		for range grpcStreamsPerConn {
			wg.Go(func() {
				var mine []time.Duration
				defer func() {
					mu.Lock()
					lat = append(lat, mine...)
					mu.Unlock()
				}()
				for time.Now().Before(deadline) && ctx.Err() == nil {
					t0 := time.Now()
					kind, status := grpcCall(ctx, c, "http://"+addr+"/grpc", msg)
					mu.Lock()
					res.Requests++
					if status != 0 {
						res.Status[status]++
					}
					if kind == "" {
						res.OK++
					} else {
						res.Errors[kind]++
					}
					mu.Unlock()
					mine = append(mine, time.Since(t0))
				}
			})
		}
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	slices.Sort(lat)
	q := func(f float64) time.Duration {
		if len(lat) == 0 {
			return 0
		}
		return lat[min(len(lat)-1, int(f*float64(len(lat))))]
	}
	res.P50, res.P90, res.P99 = q(0.5), q(0.9), q(0.99)
	if len(lat) > 0 {
		res.Max = lat[len(lat)-1]
	}
	return res, nil
}

// grpcCall makes one unary call and returns what went wrong ("" for
// nothing) and the HTTP status, if one came.
func grpcCall(ctx context.Context, c *http.Client, url string, msg []byte) (string, int) {
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(msg))
	if err != nil {
		return "request", 0
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("Te", "trailers")
	resp, err := c.Do(req)
	if err != nil {
		return "transport", 0
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.ProtoMajor != 2 {
		return fmt.Sprintf("status %d %s", resp.StatusCode, resp.Proto), resp.StatusCode
	}
	p, err := grpcmsg.Read(resp.Body)
	if err != nil || len(p)+5 != len(msg) {
		return "message", resp.StatusCode
	}
	io.Copy(io.Discard, resp.Body)
	if resp.Trailer.Get("Grpc-Status") != "0" {
		return "grpc-status", resp.StatusCode
	}
	return "", resp.StatusCode
}
