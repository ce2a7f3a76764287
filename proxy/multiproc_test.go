package proxy

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// The multi-process tests run this test binary again as fleet members. A
// child reads commands on stdin and answers on stdout, one line each:
//
//	ready                         after joining the fleet
//	go      -> done {json}         run ORBIT_N concurrent requests
//	warm N  -> warmed              make N connections (N concurrent slow requests)
//	hang K MS -> hung              start K requests to /?hold=MS, not waiting for them
//	noise   -> noised              requests that end badly (see TestMultiProcessSequence)
//	plain   -> plained {json}      ordinary requests that must all succeed
//	diff C  -> diffed {json}       run diffCase C (see TestMultiProcessDifferential)
//	exit    (or stdin closed)      leave the fleet and exit
const childEnv = "ORBIT_PROXY_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild())
	}
	if os.Getenv(adv73bEnv) != "" {
		os.Exit(runAdv73bChild())
	}
	os.Exit(m.Run())
}

type childResult struct {
	OK, Failed   int
	Errors       []string
	Stats        NodeStats
	ReusedRemote uint64
}

func runChild() int {
	seg, upstream := os.Getenv("ORBIT_SEG"), os.Getenv("ORBIT_UPSTREAM")
	n, _ := strconv.Atoi(os.Getenv("ORBIT_N"))
	budget, _ := strconv.Atoi(os.Getenv("ORBIT_BUDGET"))
	spec := testSpec
	spec.Path = seg
	p, err := orbitpool.Open(spec, orbitpool.Options{ReconcileInterval: 50 * time.Millisecond})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	sweep := 100 * time.Millisecond
	if d, err := time.ParseDuration(os.Getenv("ORBIT_SWEEP")); err == nil {
		sweep = d
	}
	nd, err := NewNode(p, NodeOptions{SweepInterval: sweep})
	if err != nil {
		fmt.Println("error", err)
		return 1
	}
	defer p.Close()
	defer nd.Close()
	tr := &Transport{Node: nd, MaxConnsPerKey: budget}
	if os.Getenv("ORBIT_DIFF") != "" {
		configure(tr)
	}
	fmt.Println("ready")
	sc := bufio.NewScanner(os.Stdin)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 0 {
			continue
		}
		switch f[0] {
		case "go":
			fmt.Println("done", childLoad(tr, upstream, n))
		case "warm":
			k, _ := strconv.Atoi(f[1])
			var wg sync.WaitGroup
			for range k {
				wg.Go(func() {
					req, _ := http.NewRequest("GET", upstream+"/slow?ms=100", nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						drain(resp)
					}
				})
			}
			wg.Wait()
			fmt.Println("warmed", nd.Stats().OpenConns)
		case "hang":
			// hang K MS: K requests the upstream holds MS ms unanswered
			// (see TestDeadOwnersBudgetHeldWhileItsConnectionsLinger).
			k, _ := strconv.Atoi(f[1])
			for range k {
				go func() {
					req, _ := http.NewRequest("GET", upstream+"/?hold="+f[2], nil)
					if resp, err := tr.RoundTrip(req); err == nil {
						drain(resp)
					}
				}()
			}
			fmt.Println("hung")
		case "stats":
			b, _ := json.Marshal(nd.Stats())
			fmt.Println("stats", string(b))
		case "noise":
			for _, path := range []string{"/truncated", "/malformed", "/cl-close", "/keepalive-then-close"} {
				childSend(tr, "GET", upstream+path, 0) // fails or not: the upstream's doing
			}
			fmt.Println("noised")
		case "plain":
			var r childResult
			for _, m := range []string{"POST", "GET", "POST"} {
				if err := childSend(tr, m, upstream+"/reason", 256<<10); err != nil {
					r.Failed++
					r.Errors = append(r.Errors, m+": "+err.Error())
				} else {
					r.OK++
				}
			}
			r.Stats = nd.Stats()
			b, _ := json.Marshal(r)
			fmt.Println("plained", string(b))
		case "diff":
			b, _ := json.Marshal(childDiff(tr, f[1], diffBase{srv: upstream, raw: os.Getenv("ORBIT_RAW")}))
			fmt.Println("diffed", string(b))
		case "exit":
			return 0
		}
	}
	return 0
}

// diffResult is what a child saw of a diffCase.
type diffResult struct {
	Obs       observation
	Err       string
	IsKind    bool // the error is the case's errKind
	RetrySafe bool
	Fatal     string // the case could not run
}

// childT is a fataler for a child: Fatalf ends the case, not the process.
type childT struct{}

type childFatal string

func (childT) Helper()                           {}
func (childT) Fatalf(format string, args ...any) { panic(childFatal(fmt.Sprintf(format, args...))) }

func childDiff(tr *Transport, name string, base diffBase) (r diffResult) {
	defer func() {
		if p := recover(); p != nil {
			msg, ok := p.(childFatal)
			if !ok {
				panic(p)
			}
			r.Fatal = string(msg)
		}
	}()
	for i := range diffCases {
		if tc := &diffCases[i]; tc.name == name {
			obs, err := run(childT{}, tc, tr, base)
			r.Obs = obs
			if err != nil {
				r.Err, r.RetrySafe = err.Error(), IsRetrySafe(err)
				r.IsKind = tc.errKind != nil && errors.Is(err, tc.errKind)
			}
			return r
		}
	}
	r.Fatal = "no case " + name
	return r
}

func childLoad(tr *Transport, upstream string, n int) string {
	var ok, failed atomic.Int64
	var mu sync.Mutex
	var errs []string
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			req, _ := http.NewRequestWithContext(ctx, "GET", fmt.Sprintf("%s/slow?ms=5&i=%d", upstream, i), nil)
			resp, err := tr.RoundTrip(req)
			if err == nil {
				var b []byte
				b, err = io.ReadAll(resp.Body)
				resp.Body.Close()
				if err == nil && string(b) != "ok" {
					err = fmt.Errorf("body %q", b)
				}
			}
			if err != nil {
				failed.Add(1)
				mu.Lock()
				if len(errs) < 5 {
					errs = append(errs, err.Error())
				}
				mu.Unlock()
				return
			}
			ok.Add(1)
		})
	}
	wg.Wait()
	st := tr.Node.Stats()
	b, _ := json.Marshal(childResult{OK: int(ok.Load()), Failed: int(failed.Load()), Errors: errs, Stats: st})
	return string(b)
}

// childSend sends one request, a POST with an n-byte body that cannot be
// replayed (no GetBody), and reads the response to its end.
func childSend(tr *Transport, method, url string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var body io.Reader
	if method == "POST" {
		body = io.NopCloser(strings.NewReader(strings.Repeat("p", n)))
	}
	req, err := http.NewRequestWithContext(ctx, method, url, body)
	if err != nil {
		return err
	}
	if method == "POST" {
		req.ContentLength = int64(n)
	}
	resp, err := tr.RoundTrip(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if _, err := io.Copy(io.Discard, resp.Body); err != nil {
		return err
	}
	if resp.StatusCode != 299 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}

// child is a running fleet member process.
type child struct {
	cmd *exec.Cmd
	in  io.WriteCloser
	out *bufio.Scanner
}

func startChild(t *testing.T, seg, upstream string, n, budget int) *child {
	t.Helper()
	return spawnChild(t, childEnv+"=1", "ORBIT_SEG="+seg, "ORBIT_UPSTREAM="+upstream,
		fmt.Sprintf("ORBIT_N=%d", n), fmt.Sprintf("ORBIT_BUDGET=%d", budget))
}

// spawnChild starts the test binary as a child process with env (which
// TestMain reads to run it as one), waits for its "ready", and kills and
// reaps it when t ends, whatever the outcome.
func spawnChild(t *testing.T, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), env...)
	cmd.Stderr = os.Stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, in: in, out: bufio.NewScanner(out)}
	c.out.Buffer(make([]byte, 1<<20), 1<<20)
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	c.expect(t, "ready")
	return c
}

func (c *child) send(t *testing.T, line string) {
	t.Helper()
	if _, err := io.WriteString(c.in, line+"\n"); err != nil {
		t.Fatal(err)
	}
}

// expect reads the child's next line, which must start with prefix, and
// returns the rest.
func (c *child) expect(t *testing.T, prefix string) string {
	t.Helper()
	lines := make(chan string, 1)
	go func() {
		if c.out.Scan() {
			lines <- c.out.Text()
		}
		close(lines)
	}()
	select {
	case l, ok := <-lines:
		if !ok {
			t.Fatalf("child exited while waiting for %q", prefix)
		}
		if !strings.HasPrefix(l, prefix) {
			t.Fatalf("child said %q, want %q", l, prefix)
		}
		return strings.TrimSpace(strings.TrimPrefix(l, prefix))
	case <-time.After(60 * time.Second):
		t.Fatalf("child silent while waiting for %q", prefix)
	}
	return ""
}

// countingUpstream counts its open TCP connections and their peak. A
// connection counts from its accept until just before the server closes its
// socket: a ConnState hook counts the close only after the socket is
// closed, late enough for a replacement, dialed as soon as the client saw
// that close, to be counted first.
func countingUpstream(t *testing.T, h http.Handler) (*httptest.Server, func() (open, peak, total int64)) {
	var open, peak, total atomic.Int64
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = &countingListener{Listener: srv.Listener, accepted: func() {
		total.Add(1)
		n := open.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
	}, closed: func() { open.Add(-1) }}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, func() (int64, int64, int64) { return open.Load(), peak.Load(), total.Load() }
}

// countingListener calls accepted for each connection it accepts and closed
// once for each, just before its socket closes.
type countingListener struct {
	net.Listener
	accepted, closed func()
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	l.accepted()
	return &countedConn{Conn: c, closed: l.closed}, nil
}

type countedConn struct {
	net.Conn
	once   sync.Once
	closed func()
}

func (c *countedConn) Close() error {
	c.once.Do(c.closed)
	return c.Conn.Close()
}

func TestMultiProcessSharedBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	u := &testUpstream{gates: make(map[string]chan struct{})}
	srv, counts := countingUpstream(t, http.HandlerFunc(u.serve))
	seg := filepath.Join(t.TempDir(), "seg")
	const procs, perProc, budget = 3, 100, 16
	var kids []*child
	for range procs {
		kids = append(kids, startChild(t, seg, srv.URL, perProc, budget))
	}
	for _, k := range kids {
		k.send(t, "go")
	}
	var total childResult
	for _, k := range kids {
		var r childResult
		if err := json.Unmarshal([]byte(k.expect(t, "done")), &r); err != nil {
			t.Fatal(err)
		}
		total.OK += r.OK
		total.Failed += r.Failed
		total.Errors = append(total.Errors, r.Errors...)
	}
	// Counters once every process is done: an owner keeps serving its
	// siblings after its own requests end.
	for i, k := range kids {
		k.send(t, "stats")
		var s NodeStats
		if err := json.Unmarshal([]byte(k.expect(t, "stats")), &s); err != nil {
			t.Fatal(err)
		}
		t.Logf("process %d: created=%d local=%d remote=%d served=%d refused=%d retries=%d",
			i, s.Created, s.ReusedLocal, s.ReusedRemote, s.ServedRemote, s.Refused, s.Retries)
		total.Stats.ReusedRemote += s.ReusedRemote
		total.Stats.ServedRemote += s.ServedRemote
		total.Stats.Created += s.Created
		total.Stats.Refused += s.Refused
		total.Stats.Retries += s.Retries
	}
	if len(total.Errors) > 0 {
		t.Logf("errors: %v", total.Errors)
	}
	_, peak, conns := counts()
	t.Logf("upstream: peak %d concurrent connections, %d in all", peak, conns)
	if total.OK != procs*perProc || total.Failed != 0 {
		t.Errorf("%d requests succeeded, %d failed; want all %d", total.OK, total.Failed, procs*perProc)
	}
	if peak > budget {
		t.Errorf("upstream saw %d concurrent connections, budget %d", peak, budget)
	}
	if total.Stats.ReusedRemote == 0 {
		t.Errorf("no remote reuse")
	}
	// Every remote use was served by its owner, or refused and retried.
	if total.Stats.ServedRemote+total.Stats.Refused != total.Stats.ReusedRemote {
		t.Errorf("remote uses %d, served %d, refused %d", total.Stats.ReusedRemote, total.Stats.ServedRemote, total.Stats.Refused)
	}
	for _, k := range kids {
		k.send(t, "exit")
	}
}

// TestMultiProcessSequence is TestFleetSequenceNoSpuriousFailures across
// three processes sharing one connection: one member sends requests that
// end badly (the upstream closing mid-body, a malformed response,
// Connection: close, the upstream closing its idle connection), then each of
// the other two sends ordinary ones (a 256 KiB POST without GetBody, a GET,
// another POST), the second through the first's connection. The ordinary
// ones never fail. Issue 10, item 3.
func TestMultiProcessSequence(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	u := newTestUpstream(t)
	seg := filepath.Join(t.TempDir(), "seg")
	// No idle sweep: only the check at reuse finds what died.
	t.Setenv("ORBIT_SWEEP", "1h")
	var kids []*child
	for range 3 {
		kids = append(kids, startChild(t, seg, "http://"+u.raw.Addr().String(), 0, 1))
	}
	var remote uint64
	for round := range 6 {
		noisy := kids[round%3]
		noisy.send(t, "noise")
		noisy.expect(t, "noised")
		// The upstream closes its idle connection 20ms after answering;
		// a request that races that close may fail, with net/http too.
		time.Sleep(150 * time.Millisecond)
		for _, k := range []*child{kids[(round+1)%3], kids[(round+2)%3]} {
			k.send(t, "plain")
			var r childResult
			if err := json.Unmarshal([]byte(k.expect(t, "plained")), &r); err != nil {
				t.Fatal(err)
			}
			if r.Failed > 0 {
				t.Errorf("round %d: %d ordinary requests failed: %v (stats %+v)", round, r.Failed, r.Errors, r.Stats)
			}
			remote += r.Stats.ReusedRemote
		}
	}
	if remote == 0 {
		t.Error("no request went through another process")
	}
	for _, k := range kids {
		k.send(t, "exit")
	}
}

// TestMultiProcessDifferential runs the differential cases through three
// processes that share one connection per upstream, round robin, so that
// most go through another process's connection, and requires each caller
// to see exactly what net/http.Transport gives. (The stream case is left
// out: its gates live in this process's upstream.)
func TestMultiProcessDifferential(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	u := newTestUpstream(t)
	seg := filepath.Join(t.TempDir(), "seg")
	t.Setenv("ORBIT_RAW", "http://"+u.raw.Addr().String())
	t.Setenv("ORBIT_DIFF", "1")
	var kids []*child
	for range 3 {
		kids = append(kids, startChild(t, seg, u.srv.URL, 0, 1))
	}
	n := 0
	for round := range 2 {
		for i := range diffCases {
			tc := diffCases[i]
			if tc.stream {
				continue
			}
			want, wantErr := run(t, &tc, referenceTransport(t), baseOf(u))
			if (wantErr != nil) != (tc.errKind != nil) {
				t.Fatalf("%s: net/http: error %v", tc.name, wantErr)
			}
			k := kids[n%len(kids)]
			n++
			k.send(t, "diff "+tc.name)
			var got diffResult
			if err := json.Unmarshal([]byte(k.expect(t, "diffed")), &got); err != nil {
				t.Fatal(err)
			}
			switch {
			case got.Fatal != "":
				t.Errorf("round %d, %s: %s", round, tc.name, got.Fatal)
			case tc.errKind == nil && got.Err != "":
				t.Errorf("round %d, %s: %s", round, tc.name, got.Err)
			case tc.errKind != nil && (!got.IsKind || got.RetrySafe):
				t.Errorf("round %d, %s: error %q, want %v and not retry-safe", round, tc.name, got.Err, tc.errKind)
			}
			wantJSON, gotJSON := normalJSON(want), normalJSON(got.Obs)
			if wantJSON != gotJSON {
				t.Errorf("round %d, %s differs from net/http:\n want %s\n  got %s", round, tc.name, wantJSON, gotJSON)
			}
		}
	}
	var remote uint64
	for _, k := range kids {
		k.send(t, "stats")
		var s NodeStats
		if err := json.Unmarshal([]byte(k.expect(t, "stats")), &s); err != nil {
			t.Fatal(err)
		}
		remote += s.ReusedRemote
	}
	if remote < uint64(n)/4 {
		t.Errorf("%d of %d exchanges went through another process, want a good share", remote, n)
	}
	for _, k := range kids {
		k.send(t, "exit")
	}
}

// normalJSON is o as JSON after a trip through JSON, as a child's
// observation has made: a body that is not UTF-8 reads back with U+FFFD.
func normalJSON(o observation) string {
	b, _ := json.Marshal(o)
	var back observation
	json.Unmarshal(b, &back)
	b, _ = json.Marshal(back)
	return string(b)
}

// TestOwnerKilledMidSplice kills -9 the owner while it splices a large
// response body to this process: the body must fail at the owner's death
// (the stream's end, not a timer, ends it), never end as if whole, and the
// dead owner's connection must come back to the budget.
func TestOwnerKilledMidSplice(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	u := newTestUpstream(t)
	seg := filepath.Join(t.TempDir(), "seg")
	owner := startChild(t, seg, u.srv.URL, 0, 1)
	owner.send(t, "warm 1")
	if got := owner.expect(t, "warmed"); got != "1" {
		t.Fatalf("owner made %s connections, want 1", got)
	}
	spec := testSpec
	spec.Path = seg
	me := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
	// A whole body first, to see that the owner splices.
	whole, err := get(t, context.Background(), me.tr, u.url("/big?cl=1&n=2097152"))
	if err != nil {
		t.Fatal(err)
	}
	drain(whole)
	// The owner counts the body once it has sent it, which may be after
	// this process has read it.
	var st NodeStats
	waitFor(t, 2*time.Second, "the owner to count one body spliced", func() bool {
		owner.send(t, "stats")
		err := json.Unmarshal([]byte(owner.expect(t, "stats")), &st)
		return err == nil && st.SplicedBodies == 1
	})
	resp, err := get(t, context.Background(), me.tr, u.url("/stall-cl"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if me.node.Stats().ReusedRemote != 2 || resp.ContentLength != 4<<20 {
		t.Fatalf("not a large body through the owner: %+v, length %d", me.node.Stats(), resp.ContentLength)
	}
	if n, err := io.CopyN(io.Discard, resp.Body, 1<<20); err != nil {
		t.Fatalf("the first MiB: %d bytes, %v", n, err)
	}
	failed := make(chan error, 1)
	go func() {
		_, err := io.Copy(io.Discard, resp.Body)
		failed <- err
	}()
	killedAt := time.Now()
	if err := owner.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-failed:
		if err == nil {
			t.Fatal("the body ended as if whole after its owner was killed")
		}
		// How soon is the machine's business: a loaded one has
		// held this process off its CPU for half a second.
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("the body failed by a timeout %v after the kill (%v), not at the stream's end", time.Since(killedAt), err)
		}
		t.Logf("the body failed %v after the kill: %v", time.Since(killedAt), err)
	case <-time.After(5 * time.Second):
		t.Fatal("the body hung after its owner was killed")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp2, err := get(t, ctx, me.tr, u.url("/cl"))
	if err != nil {
		t.Fatalf("after the owner died: %v", err)
	}
	drain(resp2)
}

// TestOwnerKilledDuringStreams kills -9 the process that owns the
// connections while this process streams responses through it: every stream
// must fail within 100ms, and the dead owner's budget must come back.
func TestOwnerKilledDuringStreams(t *testing.T) {
	if testing.Short() {
		t.Skip("multi-process test")
	}
	u := newTestUpstream(t)
	const streams = 3
	seg := filepath.Join(t.TempDir(), "seg")
	owner := startChild(t, seg, u.srv.URL, 0, streams)
	owner.send(t, "warm "+strconv.Itoa(streams))
	if got := owner.expect(t, "warmed"); got != strconv.Itoa(streams) {
		t.Fatalf("owner made %s connections, want %d", got, streams)
	}
	spec := testSpec
	spec.Path = seg
	me := newMember(t, spec, func(tr *Transport) { tr.MaxConnsPerKey = streams })

	bodies := make([]io.ReadCloser, streams)
	for i := range streams {
		resp, err := get(t, context.Background(), me.tr, u.url(fmt.Sprintf("/stream?id=kill%d", i)))
		if err != nil {
			t.Fatal(err)
		}
		bodies[i] = resp.Body
		defer resp.Body.Close()
		if _, err := readWithTimeout(resp.Body, len("chunk-0;"), 2*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	if s := me.node.Stats(); s.ReusedRemote != streams {
		t.Fatalf("%d of %d streams went through the owner", s.ReusedRemote, streams)
	}
	failedAt := make(chan time.Time, streams)
	for _, b := range bodies {
		go func() {
			buf := make([]byte, 64)
			for {
				if _, err := b.Read(buf); err != nil {
					failedAt <- time.Now()
					return
				}
			}
		}()
	}
	killedAt := time.Now()
	if err := owner.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	for range streams {
		select {
		case at := <-failedAt:
			d := at.Sub(killedAt)
			t.Logf("stream failed %v after the kill", d)
			if d > 100*time.Millisecond {
				t.Errorf("a stream failed %v after the kill", d)
			}
		case <-time.After(time.Second):
			t.Fatal("a stream hung after its owner was killed")
		}
	}
	// The survivors reclaim the dead owner's connections and budget.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	for range streams {
		wg.Go(func() {
			resp, err := get(t, ctx, me.tr, u.url("/slow?ms=50"))
			if err != nil {
				t.Errorf("after the owner died: %v", err)
				return
			}
			drain(resp)
		})
	}
	wg.Wait()
}
