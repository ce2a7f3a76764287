package scenario

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/orbitproxy/orbit/integration/load"
	"github.com/orbitproxy/orbit/integration/upstream"
)

// largeBody is the large scenario's request, which the upstream echoes:
// 1.25 MiB.
var largeBody = bytes.Repeat([]byte("orbit"), 1<<18)

// smallBody is the post scenario's request, which the upstream echoes: 1
// KiB, a body short enough to go with its head.
var smallBody = bytes.Repeat([]byte("p"), 1<<10)

// Catalogue is every scenario, with load bounded by d.
func Catalogue(d time.Duration) []Scenario {
	return []Scenario{
		{Name: "fast", Duration: d},
		{Name: "slow", Duration: d, Upstream: upstream.Options{Delay: 20 * time.Millisecond}},
		{Name: "tls", Duration: d, Upstream: upstream.Options{TLS: true}},
		// A cold upstream: a fleet-wide budget of 64 connections, at most 8
		// being dialed at once, against 256 clients arriving together.
		{Name: "stampede", Duration: d, Upstream: upstream.Options{Delay: 20 * time.Millisecond}, MaxConns: 64, MaxDialing: 8},
		{Name: "capped", Duration: d, Upstream: upstream.Options{MaxConns: 16, Delay: 5 * time.Millisecond}, MaxConns: 16},
		{Name: "kill", Duration: d, Upstream: upstream.Options{Delay: 5 * time.Millisecond}, During: killOneWorker},
		// A worker's death under POSTs, which no client sends again: the
		// errors beyond the killed worker's own clients' are requests a
		// surviving worker failed.
		{Name: "kill-post", Duration: d, Method: "POST", Path: "/echo", Body: smallBody, Upstream: upstream.Options{Delay: 5 * time.Millisecond}, During: killOneWorker},
		{Name: "reload", Duration: d, Upstream: upstream.Options{Delay: 5 * time.Millisecond}, During: reloadFleet},
		// What restarts cost a TLS upstream: reloads and a worker's death
		// under load, each a chance to drop connections and handshake
		// again.
		{Name: "tls-churn", Duration: d, Upstream: upstream.Options{TLS: true, Delay: 5 * time.Millisecond}, During: churn},
		{Name: "websocket", Duration: d, Conns: 64, Client: webSocketEcho},
		{Name: "large", Duration: d, Conns: 16, Method: "POST", Path: "/echo", Body: largeBody, Moved: 2 * len(largeBody)},
		{Name: "post", Duration: d, Method: "POST", Path: "/echo", Body: smallBody},
		// gRPC-style unary calls over h2c, clients to the fleet and the
		// fleet to an upstream that allows 100 streams per connection:
		// 64 client connections with 4 calls each in flight.
		{Name: "grpc", Duration: d, Conns: 64, Upstream: upstream.Options{H2C: true, MaxStreams: 100, Delay: 2 * time.Millisecond}, Client: grpcUnary},
	}
}

// Lookup returns the scenarios named, in catalogue order.
func Lookup(all []Scenario, names ...string) ([]Scenario, error) {
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []Scenario
	for _, s := range all {
		if want[s.Name] {
			out = append(out, s)
			delete(want, s.Name)
		}
	}
	for n := range want {
		return nil, fmt.Errorf("no scenario named %q", n)
	}
	return out, nil
}

// killOneWorker SIGKILLs worker 0 a second from now; the fleet restarts it
// and the others must keep serving.
func killOneWorker(ctx context.Context, p Proxy, row *Row) error {
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	pid, err := p.KillWorker(0)
	if errors.Is(err, errNoWorker) {
		row.Notes = append(row.Notes, "no worker killed: "+err.Error())
		return nil
	}
	if err != nil {
		return fmt.Errorf("killing worker 0: %w", err)
	}
	row.Notes = append(row.Notes, fmt.Sprintf("worker 0 (pid %d) killed with SIGKILL %.1fs into the load", pid, time.Since(row.start).Seconds()))
	return nil
}

// reloadFleet reloads every worker's configuration a second from now.
func reloadFleet(ctx context.Context, p Proxy, row *Row) error {
	select {
	case <-time.After(time.Second):
	case <-ctx.Done():
		return ctx.Err()
	}
	row.Notes = append(row.Notes, fmt.Sprintf("configuration reloaded into every worker %.1fs into the load", time.Since(row.start).Seconds()))
	return p.Reload()
}

// churn reloads the fleet, kills a worker and reloads again, a second apart
// (as many of those as the load's duration d has room for).
func churn(ctx context.Context, p Proxy, row *Row) error {
	steps := []func() error{
		func() error { return reloadFleet(ctx, p, row) },
		func() error { return killOneWorker(ctx, p, row) },
		func() error { return reloadFleet(ctx, p, row) },
	}
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

// webSocketEcho opens conns upgraded connections through the fleet and
// echoes 64-byte messages on each until d has passed; each message is a
// request in the result.
func webSocketEcho(ctx context.Context, addr string, conns int, d time.Duration) (load.Result, error) {
	res := load.Result{Errors: map[string]int{}, Status: map[int]int{}}
	var mu sync.Mutex
	fail := func(kind string) {
		mu.Lock()
		res.Errors[kind]++
		mu.Unlock()
	}
	start := time.Now()
	deadline := start.Add(d)
	msg := bytes.Repeat([]byte("w"), 64)
	var wg sync.WaitGroup
	for range conns {
		wg.Go(func() {
			c, err := net.DialTimeout("tcp", addr, 5*time.Second)
			if err != nil {
				fail("dial")
				return
			}
			defer c.Close()
			c.SetDeadline(deadline.Add(10 * time.Second))
			fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: %s\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n", addr)
			br := bufio.NewReader(c)
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
				fail("upgrade")
				return
			}
			buf := make([]byte, len(msg))
			n := 0
			for time.Now().Before(deadline) && ctx.Err() == nil {
				if _, err := c.Write(msg); err != nil {
					fail("write")
					return
				}
				if _, err := io.ReadFull(br, buf); err != nil || !bytes.Equal(buf, msg) {
					fail("echo")
					return
				}
				n++
			}
			c.(*net.TCPConn).CloseWrite()
			if rest, _ := io.ReadAll(br); len(rest) != 0 {
				fail("trailing bytes")
			}
			mu.Lock()
			res.Requests += n
			res.OK += n
			res.Status[http.StatusSwitchingProtocols]++
			mu.Unlock()
		})
	}
	wg.Wait()
	res.Elapsed = time.Since(start)
	return res, nil
}
