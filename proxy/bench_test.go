package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	countingupstream "github.com/orbitproxy/orbit/integration/upstream"
	"github.com/orbitproxy/orbit/orbitpool"
	"golang.org/x/sys/unix"
)

// The benchmarks talk to an upstream in another process, so that what they
// measure (time, allocations, heap) is this package's alone.
const upstreamEnv = "ORBIT_PROXY_TEST_UPSTREAM"

func init() {
	if os.Getenv(upstreamEnv) != "" {
		os.Exit(runBenchUpstream())
	}
}

// runBenchUpstream is a minimal HTTP/1.1 server: /ok answers at once, /hold
// after ms milliseconds, /echo with the request's body, /stream sends its head and one chunk, then stalls
// until the connection closes.
func runBenchUpstream() int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	if os.Getenv(upstreamEnv) == "tls" {
		cfg, _ := benchTLS()
		ln = tls.NewListener(ln, cfg)
	}
	fmt.Println("addr", ln.Addr().String())
	go func() { io.Copy(io.Discard, os.Stdin); os.Exit(0) }()
	for {
		c, err := ln.Accept()
		if err != nil {
			return 1
		}
		go func() {
			defer c.Close()
			br := bufio.NewReader(c)
			bw := bufio.NewWriter(c)
			for {
				req, err := http.ReadRequest(br)
				if err != nil {
					return
				}
				if req.URL.Path == "/echo" {
					body, _ := io.ReadAll(req.Body)
					fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n", len(body))
					bw.Write(body)
					bw.Flush()
					continue
				}
				io.Copy(io.Discard, req.Body)
				switch req.URL.Path {
				case "/hold":
					ms, _ := strconv.Atoi(req.URL.Query().Get("ms"))
					time.Sleep(time.Duration(ms) * time.Millisecond)
				case "/stream":
					bw.WriteString("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nfirst\r\n")
					bw.Flush()
					io.Copy(io.Discard, br)
					return
				}
				bw.WriteString("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\nok")
				bw.Flush()
			}
		}()
	}
}

// benchTLS is the bench upstream's TLS configuration, with full-size
// records as nginx sends them, and a pool that trusts it. The certificate is
// net/http's fixed test certificate, so both processes get the same one.
func benchTLS() (*tls.Config, *x509.CertPool) {
	ts := httptest.NewUnstartedServer(nil)
	ts.StartTLS()
	defer ts.Close()
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	return &tls.Config{Certificates: ts.TLS.Certificates, DynamicRecordSizingDisabled: true}, roots
}

func startBenchUpstream(b *testing.B) string { return startBenchUpstreamMode(b, "1") }

// startBenchUpstreamMode starts the bench upstream in another process; mode
// "tls" makes it an https upstream.
func startBenchUpstreamMode(b *testing.B, mode string) string {
	b.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), upstreamEnv+"="+mode)
	in, _ := cmd.StdinPipe()
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		in.Close()
		cmd.Process.Kill()
		cmd.Wait()
	})
	sc := bufio.NewScanner(out)
	if !sc.Scan() || !strings.HasPrefix(sc.Text(), "addr ") {
		b.Fatalf("upstream: %q", sc.Text())
	}
	scheme := "http://"
	if mode == "tls" {
		scheme = "https://"
	}
	return scheme + strings.TrimPrefix(sc.Text(), "addr ")
}

// cpuTime is the user and system CPU time this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func benchGet(b *testing.B, rt http.RoundTripper, req *http.Request) {
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
}

// BenchmarkThroughput compares requests per second, CPU time (user and
// system, of this process: the upstream runs in another) and allocations per
// request of the local path with net/http.Transport, serially and with
// parallel clients, to the same upstream, over plain TCP and over TLS (where
// the check that a reused connection holds no unread plaintext costs a read
// attempt per request). orbit-remote is the remote path, serially (its pair
// has one connection): its CPU time is both ends of the unix leg.
func BenchmarkThroughput(b *testing.B) {
	url := startBenchUpstream(b) + "/ok"
	tlsURL := startBenchUpstreamMode(b, "tls") + "/ok"
	_, roots := benchTLS()
	ref := &http.Transport{MaxIdleConnsPerHost: 64}
	b.Cleanup(ref.CloseIdleConnections)
	refTLS := &http.Transport{MaxIdleConnsPerHost: 64, TLSClientConfig: &tls.Config{RootCAs: roots}}
	b.Cleanup(refTLS.CloseIdleConnections)
	local := localTransport(b, nil)
	localTLS := localTransport(b, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: roots} })
	owner, client := remotePair(b, nil)
	warm(b, owner, url)
	for _, rt := range []struct {
		name string
		rt   http.RoundTripper
		url  string
	}{{"nethttp", ref, url}, {"orbit-local", local, url}, {"orbit-remote", client.tr, url}, {"nethttp-tls", refTLS, tlsURL}, {"orbit-local-tls", localTLS, tlsURL}} {
		url := rt.url
		for _, par := range []bool{false, true} {
			if par && rt.rt == client.tr {
				continue
			}
			name := rt.name + "/serial"
			if par {
				name = rt.name + "/parallel"
			}
			b.Run(name, func(b *testing.B) {
				req, _ := http.NewRequest("GET", url, nil)
				benchGet(b, rt.rt, req)
				b.ReportAllocs()
				cpu0 := cpuTime(b)
				b.ResetTimer()
				if par {
					b.SetParallelism(4)
					b.RunParallel(func(pb *testing.PB) {
						req, _ := http.NewRequest("GET", url, nil)
						for pb.Next() {
							benchGet(b, rt.rt, req)
						}
					})
				} else {
					for b.Loop() {
						benchGet(b, rt.rt, req)
					}
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
				b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-us/req")
			})
		}
	}
}

// benchPaths returns net/http's Transport, the local path and the remote
// path (its owner holding a connection to url's upstream).
func benchPaths(b *testing.B, url string) (ref *http.Transport, local, remote *Transport) {
	ref = &http.Transport{}
	b.Cleanup(ref.CloseIdleConnections)
	owner, client := remotePair(b, nil)
	warm(b, owner, url)
	return ref, localTransport(b, nil), client.tr
}

// benchPostEcho sends body, of n bytes, to url, which echoes it.
func benchPostEcho(b *testing.B, rt http.RoundTripper, url string, body io.Reader, n int) {
	req, _ := http.NewRequest("POST", url, body)
	req.ContentLength = int64(n)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	if got, _ := io.Copy(io.Discard, resp.Body); got != int64(n) {
		b.Fatalf("echo of %d bytes", got)
	}
	resp.Body.Close()
}

// BenchmarkSmallPost sends a POST with a 1 KiB body, as a server hands one
// on (no GetBody, not known to be in memory), serially through
// net/http.Transport, the local path and the remote path, and reports CPU
// time per request as BenchmarkThroughput does.
func BenchmarkSmallPost(b *testing.B) {
	url := startBenchUpstream(b) + "/echo"
	body := bytes.Repeat([]byte("p"), 1<<10)
	ref, local, remote := benchPaths(b, url)
	for _, rt := range []struct {
		name string
		rt   http.RoundTripper
	}{{"nethttp", ref}, {"orbit-local", local}, {"orbit-remote", remote}} {
		b.Run(rt.name, func(b *testing.B) {
			post := func() { benchPostEcho(b, rt.rt, url, io.NopCloser(bytes.NewReader(body)), len(body)) }
			post()
			b.ReportAllocs()
			cpu0 := cpuTime(b)
			for b.Loop() {
				post()
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
			b.ReportMetric(float64((cpuTime(b)-cpu0).Nanoseconds())/1e3/float64(b.N), "cpu-us/req")
		})
	}
}

// BenchmarkLargeBody sends the end-to-end large-body scenario's request, a
// 1.25 MiB POST that the upstream echoes, serially through net/http.Transport,
// the local path and the remote path, the last with the owner's bodies
// spliced (the default) and copied. CPU time is this process's per MiB of
// bodies (2.5 MiB a request); on the remote path it is both ends of the unix
// leg.
func BenchmarkLargeBody(b *testing.B) {
	url := startBenchUpstream(b) + "/echo"
	body := bytes.Repeat([]byte("orbit"), 1<<18)
	ref, local, remote := benchPaths(b, url)
	for _, rt := range []struct {
		name   string
		rt     http.RoundTripper
		splice int64
	}{{"nethttp", ref, spliceMinBody}, {"orbit-local", local, spliceMinBody}, {"orbit-remote", remote, spliceMinBody}, {"orbit-remote-copied", remote, 1 << 62}} {
		b.Run(rt.name, func(b *testing.B) {
			defer func(v int64) { spliceMinBody = v }(spliceMinBody)
			spliceMinBody = rt.splice
			post := func() { benchPostEcho(b, rt.rt, url, bytes.NewReader(body), len(body)) }
			post()
			b.SetBytes(2 * int64(len(body)))
			cpu0 := cpuTime(b)
			for b.Loop() {
				post()
			}
			mib := float64(b.N) * 2 * float64(len(body)) / (1 << 20)
			b.ReportMetric(float64((cpuTime(b)-cpu0).Microseconds())/mib, "cpu-us/MiB")
		})
	}
}

// BenchmarkRemoteAddedLatency alternates requests on the local path and on
// the remote path (through an owner in this process, over its unix socket)
// and reports p50 and p99 of each and of the difference. Between the two it
// times a bare round trip on a unix stream to an echo goroutine of this
// process, the floor of any hop: the remote path's added latency over that
// floor is what the hop's own work costs, whatever the machine's load.
func BenchmarkRemoteAddedLatency(b *testing.B) {
	url := startBenchUpstream(b) + "/ok"
	local := localTransport(b, nil)
	owner, client := remotePair(b, nil)
	warm(b, owner, url)
	rtt := unixEcho(b)
	fdRTT := unixDescriptorEcho(b, url)
	body := bytes.Repeat([]byte("b"), 1<<10)
	for _, method := range []string{"GET", "POST"} {
		// A POST's body waits on the remote path for the owner's accept.
		b.Run(method, func(b *testing.B) {
			newReq := func() *http.Request {
				if method == "GET" {
					req, _ := http.NewRequest("GET", url, nil)
					return req
				}
				req, _ := http.NewRequest("POST", url, bytes.NewReader(body))
				return req
			}
			req := newReq()
			benchGet(b, local, req)
			benchGet(b, client.tr, newReq())
			var lt, rtimes, ut, ft []time.Duration
			before := client.node.Stats().ReusedRemote
			hopStageMedians() // the stages of the warm-up exchanges
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				lreq, rreq := req, req
				if method != "GET" {
					lreq, rreq = newReq(), newReq()
				}
				t0 := time.Now()
				benchGet(b, local, lreq)
				t1 := time.Now()
				benchGet(b, client.tr, rreq)
				t2 := time.Now()
				rtt()
				t3 := time.Now()
				fdRTT()
				lt = append(lt, t1.Sub(t0))
				rtimes = append(rtimes, t2.Sub(t1))
				ut = append(ut, t3.Sub(t2))
				ft = append(ft, time.Since(t3))
			}
			b.StopTimer()
			if client.node.Stats().ReusedRemote-before < uint64(len(rtimes)) {
				b.Fatalf("remote requests did not all go through the owner: client %+v owner %+v", client.node.Stats(), owner.node.Stats())
			}
			pct := func(d []time.Duration, p float64) float64 {
				slices.Sort(d)
				return float64(d[int(float64(len(d)-1)*p)].Nanoseconds()) / 1e3
			}
			lp50, lp99 := pct(lt, .5), pct(lt, .99)
			rp50, rp99 := pct(rtimes, .5), pct(rtimes, .99)
			b.ReportMetric(lp50, "local-p50-us")
			b.ReportMetric(lp99, "local-p99-us")
			b.ReportMetric(rp50, "remote-p50-us")
			b.ReportMetric(rp99, "remote-p99-us")
			b.ReportMetric(rp50-lp50, "added-p50-us")
			b.ReportMetric(rp99-lp99, "added-p99-us")
			up50 := pct(ut, .5)
			b.ReportMetric(up50, "unix-rtt-p50-us")
			b.ReportMetric(rp50-lp50-up50, "added-over-rtt-p50-us")
			b.ReportMetric(pct(ft, .5), "fd-rtt-p50-us")
			for name, us := range hopStageMedians() {
				b.ReportMetric(us, name+"-us")
			}
		})
	}
}

// unixEcho starts a goroutine that echoes what it reads on one end of a unix
// stream pair, and returns a function that sends a request-sized message on
// the other end and reads the echo.
func unixEcho(b *testing.B) func() {
	b.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	conns := make([]net.Conn, 2)
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "echo")
		conns[i], err = net.FileConn(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
	}
	b.Cleanup(func() { conns[0].Close(); conns[1].Close() })
	go io.Copy(conns[1], conns[1])
	msg := make([]byte, 128)
	return func() {
		if _, err := conns[0].Write(msg); err != nil {
			b.Fatal(err)
		}
		if _, err := io.ReadFull(conns[0], msg); err != nil {
			b.Fatal(err)
		}
	}
}

// unixDescriptorEcho is unixEcho with the descriptor of a TCP connection
// to url's host in each answer, which the asker makes into a net.Conn and
// closes: the floor of a hop that would lend an owner's upstream connection
// to the sibling for one exchange (SCM_RIGHTS) instead of relaying it.
func unixDescriptorEcho(b *testing.B, url string) func() {
	b.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		b.Fatal(err)
	}
	var conns [2]*net.UnixConn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "lend")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		conns[i] = c.(*net.UnixConn)
	}
	up, err := net.Dial("tcp", strings.TrimPrefix(url[:strings.LastIndex(url, "/")], "http://"))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conns[0].Close(); conns[1].Close(); up.Close() })
	raw, err := up.(*net.TCPConn).SyscallConn()
	if err != nil {
		b.Fatal(err)
	}
	go func() {
		msg := make([]byte, 128)
		for {
			if _, err := io.ReadFull(conns[1], msg); err != nil {
				return
			}
			var werr error
			raw.Control(func(fd uintptr) {
				_, _, werr = conns[1].WriteMsgUnix(msg[:16], unix.UnixRights(int(fd)), nil)
			})
			if werr != nil {
				return
			}
		}
	}()
	msg := make([]byte, 128)
	oob := make([]byte, unix.CmsgSpace(4))
	return func() {
		if _, err := conns[0].Write(msg); err != nil {
			b.Fatal(err)
		}
		_, oobn, _, _, err := conns[0].ReadMsgUnix(msg[:16], oob)
		if err != nil {
			b.Fatal(err)
		}
		cmsgs, err := unix.ParseSocketControlMessage(oob[:oobn])
		if err != nil || len(cmsgs) != 1 {
			b.Fatalf("control messages %v: %v", cmsgs, err)
		}
		lent, err := unix.ParseUnixRights(&cmsgs[0])
		if err != nil || len(lent) != 1 {
			b.Fatalf("descriptors %v: %v", lent, err)
		}
		f := os.NewFile(uintptr(lent[0]), "lent")
		c, err := net.FileConn(f)
		f.Close()
		if err != nil {
			b.Fatal(err)
		}
		c.Close()
	}
}

func heapAndStacks() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapInuse + ms.StackInuse
}

// BenchmarkMemoryPerIdleConn reports the heap and stack one idle upstream
// connection costs this process (registered in the pool, no goroutine).
func BenchmarkMemoryPerIdleConn(b *testing.B) {
	url := startBenchUpstream(b)
	const n = 100
	m := newMember(b, orbitpool.PoolSpec{Lanes: 1, Keys: 32, ResourcesPerLane: 256}, nil)
	before := heapAndStacks()
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", url+"/hold?ms=500", nil)
			benchGet(b, m.tr, req)
		})
	}
	wg.Wait()
	if got := m.node.Stats().OpenConns; got != n {
		b.Fatalf("%d idle conns, want %d", got, n)
	}
	after := heapAndStacks()
	// The measurement is made once; the loop only satisfies the framework.
	for b.Loop() {
	}
	b.ReportMetric(float64(int64(after)-int64(before))/n, "bytes/idle-conn")
}

// BenchmarkMemoryPerRemoteStream reports the heap and stack one in-flight
// remote stream costs, owner and client together (both are in this process):
// the unix stream's buffers on both ends, the relay buffer and goroutines.
// The upstream connections it runs on are excluded: they exist either way.
func BenchmarkMemoryPerRemoteStream(b *testing.B) {
	url := startBenchUpstream(b)
	const n = 50
	owner, client := remotePair(b, func(tr *Transport) { tr.MaxConnsPerKey = n })
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", url+"/hold?ms=500", nil)
			benchGet(b, owner.tr, req)
		})
	}
	wg.Wait()
	if got := owner.node.Stats().OpenConns; got != n {
		b.Fatalf("owner has %d conns, want %d", got, n)
	}
	// One stream first, so that per-process one-offs are not counted.
	bodies := []io.ReadCloser{openStream(b, client.tr, url)}
	before := heapAndStacks()
	for range n - 1 {
		bodies = append(bodies, openStream(b, client.tr, url))
	}
	after := heapAndStacks()
	if s := client.node.Stats(); s.ReusedRemote != n {
		b.Fatalf("%d of %d streams went through the owner (%+v)", s.ReusedRemote, n, s)
	}
	for b.Loop() {
	}
	b.ReportMetric(float64(int64(after)-int64(before))/(n-1), "bytes/remote-stream")
	for _, body := range bodies {
		body.Close()
	}
}

func openStream(b *testing.B, rt http.RoundTripper, url string) io.ReadCloser {
	req, _ := http.NewRequestWithContext(context.Background(), "GET", url+"/stream", nil)
	resp, err := rt.RoundTrip(req)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, 5)
	if _, err := io.ReadFull(resp.Body, buf); err != nil {
		b.Fatal(err)
	}
	return resp.Body
}

// BenchmarkUnixLegCodec is the HTTP/1.1 codec work the unix leg adds to one
// exchange, in memory: the client writes the request, the owner parses it
// and re-writes the upstream's response, the client parses that.
func BenchmarkUnixLegCodec(b *testing.B) {
	up, _ := http.NewRequest("GET", "http://example.com/path?q=1", nil)
	up.Header.Set("Accept", "*/*")
	up.Header.Set("X-Request-Id", "abc123")
	rawResp := "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Type: text/plain\r\nDate: " + fixedDate + "\r\nServer: x\r\n\r\nok"
	upResp, err := http.ReadResponse(bufio.NewReader(strings.NewReader(rawResp)), up)
	if err != nil {
		b.Fatal(err)
	}
	var wire bytes.Buffer
	bw := bufio.NewWriter(&wire)
	br := bufio.NewReader(&wire)
	rl := &relay{bw: bw}
	b.ReportAllocs()
	for b.Loop() {
		wire.Reset()
		bw.Reset(&wire)
		up.Write(bw)
		bw.Flush()
		br.Reset(&wire)
		req, err := http.ReadRequest(br)
		if err != nil {
			b.Fatal(err)
		}
		upResp.Body = io.NopCloser(strings.NewReader("ok"))
		rl.sentAccept = true
		wire.Reset()
		bw.Reset(&wire)
		if !rl.response(upResp, req, nil, nil) {
			b.Fatal("relay failed")
		}
		br.Reset(&wire)
		readHead(br)
		resp, err := http.ReadResponse(br, up)
		if err != nil {
			b.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
	}
}

// BenchmarkIdleCheck measures the check that runs before every reuse of a
// connection, on plain TCP and on TLS (where it adds a read attempt with a
// deadline in the past, to see plaintext crypto/tls holds).
func BenchmarkIdleCheck(b *testing.B) {
	cfg, roots := benchTLS()
	for _, mode := range []string{"plain", "tls"} {
		b.Run(mode, func(b *testing.B) {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				b.Fatal(err)
			}
			defer ln.Close()
			if mode == "tls" {
				ln = tls.NewListener(ln, cfg)
			}
			go func() {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				defer c.Close()
				io.Copy(io.Discard, c)
			}()
			u := upstream{Scheme: "http", Addr: ln.Addr().String()}
			if mode == "tls" {
				u.Scheme, u.TLS = "https", &tls.Config{RootCAs: roots, ServerName: "example.com"}
			}
			d := dialer{}
			c, err := d.dial(context.Background(), &u, nil)
			if err != nil {
				b.Fatal(err)
			}
			defer c.close()
			b.ReportAllocs()
			for b.Loop() {
				if !c.idleAlive(nil) {
					b.Fatal("idle connection found unusable")
				}
			}
		})
	}
}

// BenchmarkCappedChurn: three processes share a key capped at 6 whose
// connections each carry 20 requests before they are retired, so that the
// key is dialed again all the time; each loop sends 6000 requests from 4
// goroutines per process. It reports what ownership cost the upstream: the
// connections dialed and moved per loop (300 are the request limit's), and
// the dials passed to a sibling holding fewer (see dialToward).
func BenchmarkCappedChurn(b *testing.B) {
	const limit, perConn, total = 6, 20, 6000
	var created, moved, passed uint64
	for b.Loop() {
		b.StopTimer()
		up := startCappedUpstream(b, countingupstream.Options{MaxConns: limit, Delay: 500 * time.Microsecond})
		ms := windowFleet(b, 3, 16, func(tr *Transport) {
			tr.MaxConnsPerKey = limit
			tr.MaxRequestsPerConn = perConn
		})
		b.StartTimer()
		if errs := steadyLoad(ms, []int{4, 4, 4}, up.URL+"/", total); errs != 0 {
			b.Fatalf("%d requests failed", errs)
		}
		b.StopTimer()
		for _, m := range ms {
			st := m.node.Stats()
			created, moved, passed = created+st.Created, moved+st.Rebalanced, passed+st.DialsPassed
		}
		if st := up.Stats(); st.Refused != 0 || st.Peak > limit {
			b.Fatalf("the upstream refused %d connections and saw %d at once, with the cap at %d", st.Refused, st.Peak, limit)
		}
		b.StartTimer()
	}
	n := float64(b.N)
	b.ReportMetric(float64(created)/n, "dialed/op")
	b.ReportMetric(float64(moved)/n, "moved/op")
	b.ReportMetric(float64(passed)/n, "passed/op")
}

// BenchmarkH2Throughput compares requests per second and allocations per
// request over one h2c connection, 8 callers per CPU, through
// net/http.Transport and the local path, to an upstream that answers at
// once: what the pool adds to an HTTP/2 exchange, and under Go 1.27 what
// letting one request at a time into the ClientConn costs (h2conn.roundTrip).
func BenchmarkH2Throughput(b *testing.B) {
	up := newRawH2(b, func(s *rawStream) {
		s.headers(false, ":status", "200", "content-type", "text/plain")
		s.data(true, []byte("ok"))
	})
	var p http.Protocols
	p.SetUnencryptedHTTP2(true)
	ref := &http.Transport{Protocols: &p}
	b.Cleanup(ref.CloseIdleConnections)
	local := newH2LocalMember(b).tr
	for _, rt := range []struct {
		name string
		rt   http.RoundTripper
	}{{"nethttp-h2c", ref}, {"orbit-local-h2c", local}} {
		b.Run(rt.name, func(b *testing.B) {
			req, _ := http.NewRequest("GET", up.url+"/", nil)
			benchGet(b, rt.rt, req)
			b.ReportAllocs()
			b.SetParallelism(8)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				req, _ := http.NewRequest("GET", up.url+"/", nil)
				for pb.Next() {
					benchGet(b, rt.rt, req)
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "req/s")
		})
	}
}
