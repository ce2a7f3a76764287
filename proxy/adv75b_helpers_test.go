package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// adv75bUpstream echoes "METHOD:body:q" and counts, by q, every request that
// reached it (its head read by the handler) and every POST body read whole.
type adv75bUpstream struct {
	srv   *httptest.Server
	mu    sync.Mutex
	seen  map[string]int // q -> times the handler ran
	posts map[string]int // POST q -> times its body was read whole
	// postHeads counts, by q, the POST heads the handler saw: a POST's
	// head at the upstream twice is a POST sent twice, whole body or not.
	postHeads map[string]int
	delay     func() time.Duration
	// slowRead, if set, is a pause after each 32 KiB of a request body.
	slowRead time.Duration
}

func newAdv75bUpstream(t testing.TB, conf func(*httptest.Server)) *adv75bUpstream {
	u := &adv75bUpstream{seen: map[string]int{}, posts: map[string]int{}, postHeads: map[string]int{}}
	u.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query().Get("q")
		u.mu.Lock()
		u.seen[q]++
		if r.Method == "POST" {
			u.postHeads[q]++
		}
		u.mu.Unlock()
		var b []byte
		var err error
		if u.slowRead > 0 {
			buf := make([]byte, 32<<10)
			for {
				k, rerr := r.Body.Read(buf)
				b = append(b, buf[:k]...)
				if rerr != nil {
					if rerr != io.EOF {
						err = rerr
					}
					break
				}
				time.Sleep(u.slowRead)
			}
		} else {
			b, err = io.ReadAll(r.Body)
		}
		if r.Method == "POST" && err == nil {
			u.mu.Lock()
			u.posts[q]++
			u.mu.Unlock()
		}
		if u.delay != nil {
			time.Sleep(u.delay())
		}
		io.WriteString(w, r.Method+":"+string(b)+":"+q)
	}))
	if conf != nil {
		conf(u.srv)
	}
	u.srv.Start()
	t.Cleanup(u.srv.Close)
	return u
}

func (u *adv75bUpstream) count(q string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.seen[q]
}

// dupPosts lists POSTs (by q) the upstream read whole more than once.
func (u *adv75bUpstream) dupPosts() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var d []string
	for b, n := range u.posts {
		if n > 1 {
			d = append(d, fmt.Sprintf("%s x%d", b, n))
		}
	}
	for b, n := range u.postHeads {
		if n > 1 {
			d = append(d, fmt.Sprintf("%s head x%d (body whole x%d)", b, n, u.posts[b]))
		}
	}
	sort.Strings(d)
	return d
}

// adv75bLoad runs mixed GET/POST requests (unique q and body) on the given
// members until stop is called, and records each failure with whether the
// upstream had seen the request.
type adv75bLoad struct {
	u       *adv75bUpstream
	url     string
	prefix  string
	seq     atomic.Int64
	sent    atomic.Int64
	ok      atomic.Int64
	stopCh  chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	fails   []adv75bFail
	timeout time.Duration
	slow    atomic.Int64 // requests that returned later than timeout+5s
}

type adv75bFail struct {
	desc   string
	q      string
	method string
}

func startAdv75bLoad(t testing.TB, u *adv75bUpstream, prefix string, timeout time.Duration, workers map[*member]int) *adv75bLoad {
	return startAdv75bLoadURL(t, u, u.srv.URL, prefix, timeout, workers)
}

// startAdv75bLoadURL is startAdv75bLoad against url (u's handler behind
// another server).
func startAdv75bLoadURL(t testing.TB, u *adv75bUpstream, url, prefix string, timeout time.Duration, workers map[*member]int) *adv75bLoad {
	l := &adv75bLoad{u: u, url: url, prefix: prefix, stopCh: make(chan struct{}), timeout: timeout}
	for m, n := range workers {
		for w := range n {
			l.wg.Add(1)
			go l.worker(m, w)
		}
	}
	t.Cleanup(l.stop)
	return l
}

func (l *adv75bLoad) worker(m *member, w int) {
	defer l.wg.Done()
	for {
		select {
		case <-l.stopCh:
			return
		default:
		}
		i := l.seq.Add(1)
		q := fmt.Sprintf("%s%d", l.prefix, i)
		method, body := "GET", ""
		var rb io.Reader
		if i%2 == 0 {
			method, body = "POST", "b"+q
			rb = strings.NewReader(body)
		}
		ctx, cancel := context.WithTimeout(context.Background(), l.timeout)
		req, _ := http.NewRequestWithContext(ctx, method, l.url+"/?q="+q, rb)
		if method == "POST" && i%4 == 0 {
			// No GetBody: not replayable by net/http either.
			req.GetBody = nil
		}
		l.sent.Add(1)
		start := time.Now()
		resp, err := m.tr.RoundTrip(req)
		var got []byte
		if err == nil {
			got, err = io.ReadAll(resp.Body)
			resp.Body.Close()
		}
		cancel()
		if time.Since(start) > l.timeout+5*time.Second {
			l.slow.Add(1)
		}
		want := method + ":" + body + ":" + q
		switch {
		case err == nil && string(got) == want:
			l.ok.Add(1)
		case err == nil:
			l.mu.Lock()
			l.fails = append(l.fails, adv75bFail{fmt.Sprintf("WRONG RESPONSE %s %s: got %q", method, q, got), q, method})
			l.mu.Unlock()
		default:
			l.mu.Lock()
			l.fails = append(l.fails, adv75bFail{fmt.Sprintf("%s %s (worker %d): %v", method, q, w, err), q, method})
			l.mu.Unlock()
		}
	}
}

func (l *adv75bLoad) stop() {
	select {
	case <-l.stopCh:
	default:
		close(l.stopCh)
	}
	l.wg.Wait()
}

// failures returns the failed requests' descriptions, those the upstream
// never saw marked "unsent", and the number of wrong responses.
func (l *adv75bLoad) failures() (all []string, unsent int, wrong int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, f := range l.fails {
		d := f.desc
		if strings.HasPrefix(d, "WRONG") {
			wrong++
		} else if l.u.count(f.q) == 0 {
			unsent++
			d = "[unsent] " + d
		}
		all = append(all, d)
	}
	return all, unsent, wrong
}

func adv75bFirst(s []string, n int) string {
	if len(s) > n {
		return strings.Join(s[:n], "; ") + fmt.Sprintf("; ... (%d more)", len(s)-n)
	}
	return strings.Join(s, "; ")
}
