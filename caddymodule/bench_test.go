package caddymodule

import (
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// BenchmarkThroughCaddy sends GETs through Caddy in this process, to one
// upstream in this process, once through a site whose reverse_proxy uses the
// orbit_pool transport (a fleet of one: every request takes a connection of
// its own process) and once through one that uses the stock http transport,
// and reports requests per second and the CPU time (user and system) this
// process spent per request. Client, Caddy and upstream are the same for
// both, so the difference between the two CPU figures is the difference
// between the transports, with everything the Caddy module does around
// orbit's (its wait timeout, deadline, metrics).
//
//	go test -run '^$' -bench ThroughCaddy -benchtime 3s -count 3 ./caddymodule/
func BenchmarkThroughCaddy(b *testing.B) {
	up := newUpstream(b, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), false)
	orbitPort, stockPort := freePort(b), freePort(b)
	startCaddy(b, "", site(orbitPort, up.hostport(), "", "")+fmt.Sprintf(`:%d {
	bind 127.0.0.1
	reverse_proxy %s {
		transport http {
			keepalive_idle_conns_per_host 1024
		}
	}
}
`, stockPort, up.hostport()))
	for _, v := range []struct {
		name string
		port int
	}{{"orbit", orbitPort}, {"stock", stockPort}} {
		b.Run(v.name, func(b *testing.B) {
			url := fmt.Sprintf("http://127.0.0.1:%d/", v.port)
			c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
			defer c.CloseIdleConnections()
			get := func() {
				resp, err := c.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					b.Fatalf("status %d", resp.StatusCode)
				}
			}
			get()
			b.ReportAllocs()
			cpu0 := processCPU(b)
			b.ResetTimer()
			b.SetParallelism(8)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					get()
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.ReportMetric(float64((processCPU(b)-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-us/req")
		})
	}
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
