package proxy

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// echoBody answers with the request's body, of the same declared length.
func echoBody(w http.ResponseWriter, r *http.Request) {
	b, err := io.ReadAll(r.Body)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.Write(b)
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	r := rand.New(rand.NewPCG(uint64(n), 7))
	for i := range b {
		b[i] = byte(r.Uint32())
	}
	return b
}

// postEcho sends body through rt, with header fields given as name and
// value pairs, and returns what came back.
func postEcho(t *testing.T, rt http.RoundTripper, url string, body []byte, fields ...string) []byte {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	for i := 0; i+1 < len(fields); i += 2 {
		req.Header.Set(fields[i], fields[i+1])
	}
	resp, err := rt.RoundTrip(req)
	if err != nil {
		t.Fatalf("POST %d bytes: %v", len(body), err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatalf("POST %d bytes: reading the echo: %v", len(body), err)
	}
	return got
}

// TestSiblingBodiesAreSpliced: a sibling's large response bodies from a
// plain TCP upstream go through the owner by splice(2), byte for byte, with
// the large request bodies that the upstream echoes copied the other way;
// the upstream connection stays in step for the next exchange; small bodies
// are copied.
func TestSiblingBodiesAreSpliced(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(echoBody))
	defer srv.Close()
	owner, client := remotePair(t, nil)
	warm(t, owner, srv.URL+"/warm")
	var spliced uint64
	for _, tc := range []struct {
		size    int
		spliced uint64
	}{
		{1<<20 + 1<<18, 1},
		{int(spliceMinBody), 1}, // the threshold
		{int(spliceMinBody) - 1, 0},
		{5<<20 + 3, 1}, // the pipe's size many times over
		{100, 0},
	} {
		before := owner.node.Stats()
		body := randomBytes(tc.size)
		if got := postEcho(t, client.tr, srv.URL+"/echo", body); !bytes.Equal(got, body) {
			t.Fatalf("%d bytes: echo differs (%d bytes back)", tc.size, len(got))
		}
		// The owner counts a body once it has sent it, which may be
		// after the sibling has read it.
		spliced += tc.spliced
		waitFor(t, 2*time.Second, "the owner to count what it spliced", func() bool {
			return owner.node.Stats().SplicedBodies >= spliced
		})
		after := owner.node.Stats()
		if after.SplicedBodies != spliced {
			t.Errorf("%d bytes: %d bodies spliced in all, want %d", tc.size, after.SplicedBodies, spliced)
		}
		if after.ServedRemote != before.ServedRemote+1 {
			t.Errorf("%d bytes: not served through the owner: %+v", tc.size, after)
		}
	}
	if st := owner.node.Stats(); st.Created != 1 || st.OpenConns != 1 {
		t.Errorf("the upstream connection was not kept across spliced bodies: %+v", st)
	}
}

// TestTLSBodiesAreCopied: bytes on a TLS upstream connection are the
// owner's to decrypt, so its sibling's bodies are copied, not spliced.
func TestTLSBodiesAreCopied(t *testing.T) {
	srv := httptest.NewTLSServer(http.HandlerFunc(echoBody))
	defer srv.Close()
	pool := x509.NewCertPool()
	pool.AddCert(srv.Certificate())
	owner, client := remotePair(t, func(tr *Transport) { tr.TLSClientConfig = &tls.Config{RootCAs: pool} })
	warm(t, owner, srv.URL+"/warm")
	body := randomBytes(1 << 20)
	if got := postEcho(t, client.tr, srv.URL+"/echo", body); !bytes.Equal(got, body) {
		t.Fatalf("echo differs (%d bytes back)", len(got))
	}
	if st := owner.node.Stats(); st.SplicedBodies != 0 || st.ServedRemote != 1 {
		t.Errorf("%+v: want the body served through the owner and copied", st)
	}
}

// TestSplicedResponseCutShort: an upstream that closes partway through a
// spliced response body gives the sibling an error, never a short body that
// looks whole, and the broken connection leaves the pool.
func TestSplicedResponseCutShort(t *testing.T) {
	const declared, sent = 1 << 20, 300 << 10
	raw := rawUpstream(t, func(c net.Conn, _ *bufio.Reader, req *http.Request) bool {
		if req.URL.Path != "/short" {
			io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
			return true
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: "+strconv.Itoa(declared)+"\r\n\r\n")
		c.Write(randomBytes(sent))
		c.Close()
		return false
	})
	owner, client := remotePair(t, nil)
	warm(t, owner, raw+"/warm")
	resp, err := get(t, context.Background(), client.tr, raw+"/short")
	if err != nil {
		t.Fatal(err)
	}
	n, err := io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err == nil || n >= declared {
		t.Fatalf("read %d of %d bytes with error %v; want an error before the end", n, declared, err)
	}
	waitFor(t, 2*time.Second, "the broken connection to leave the pool", func() bool {
		return owner.node.Stats().OpenConns == 0
	})
	// The owner and the sibling go on.
	resp, err = get(t, context.Background(), client.tr, raw+"/after")
	if err != nil {
		t.Fatalf("next request: %v", err)
	}
	drain(resp)
}

// TestSplicedResponseSiblingGone: a sibling that stops reading and goes in
// the middle of a spliced response body ends the owner's exchange, and the
// upstream connection, with the rest of that body still on it, is closed
// rather than reused.
func TestSplicedResponseSiblingGone(t *testing.T) {
	const size = 64 << 20
	wrote := make(chan error, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/big" {
			io.WriteString(w, "ok")
			return
		}
		w.Header().Set("Content-Length", strconv.Itoa(size))
		chunk := randomBytes(64 << 10)
		var err error
		for i := 0; i < size/len(chunk) && err == nil; i++ {
			_, err = w.Write(chunk)
		}
		wrote <- err
	}))
	defer srv.Close()
	owner, client := remotePair(t, nil)
	warm(t, owner, srv.URL+"/warm")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := get(t, ctx, client.tr, srv.URL+"/big")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.CopyN(io.Discard, resp.Body, 1<<20); err != nil {
		t.Fatal(err)
	}
	cancel()
	resp.Body.Close()
	select {
	case err := <-wrote:
		if err == nil {
			t.Fatal("the upstream wrote the whole body to a sibling that had gone")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the upstream is still writing: the owner did not end the exchange")
	}
	waitFor(t, 2*time.Second, "the upstream connection to close", func() bool {
		return owner.node.Stats().OpenConns == 0
	})
}

// TestLargeBodyPrefersItsOwnConnection: under LocalFirst, a request that
// declares a body of largeBody or more opens a connection of its own, within
// the key's budget, rather than have a sibling relay every byte of it; with
// the budget spent it goes through the sibling; a smaller body that could
// be sent again (it carries an Idempotency-Key) goes through the sibling at
// once.
func TestLargeBodyPrefersItsOwnConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(echoBody))
	defer srv.Close()
	for _, tc := range []struct {
		name             string
		size, maxConns   int
		created, remoter uint64
	}{
		{"large", largeBody, 2, 1, 0},
		{"large, budget spent", largeBody, 1, 0, 1},
		{"small", largeBody - 1, 2, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := newFleet(t, 2, func(tr *Transport) { tr.MaxConnsPerKey = tc.maxConns })
			owner, client := ms[0], ms[1]
			warm(t, owner, srv.URL+"/warm")
			body := randomBytes(tc.size)
			if got := postEcho(t, client.tr, srv.URL+"/echo", body, "Idempotency-Key", "1"); !bytes.Equal(got, body) {
				t.Fatalf("echo differs (%d bytes back)", len(got))
			}
			if st := client.node.Stats(); st.Created != tc.created || st.ReusedRemote != tc.remoter {
				t.Errorf("created %d, through the sibling %d; want %d, %d", st.Created, st.ReusedRemote, tc.created, tc.remoter)
			}
		})
	}
}

// TestUnreplayablePrefersItsOwnConnection: under LocalFirst, with a
// sibling's idle connection there, an HTTP/1.1 request that could not be
// sent again if that sibling died during its exchange opens a connection of
// its own while the key's budget allows, so that only its own process's
// death can fail it; with the budget spent it goes through the sibling.
// Not replayable: a POST without an Idempotency-Key, and one with a key
// whose body cannot be read again (no GetBody, as reverse_proxy hands every
// body on). Replayable, and through the sibling: a GET, and a POST with a
// key and a rewindable body. With RelayUnreplayable, a POST goes through
// the sibling too.
func TestUnreplayablePrefersItsOwnConnection(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(echoBody))
	defer srv.Close()
	for _, tc := range []struct {
		name             string
		method           string
		key, rewindable  bool
		maxConns         int
		relay            bool
		created, remoter uint64
	}{
		{"POST", "POST", false, true, 2, false, 1, 0},
		{"POST, budget spent", "POST", false, true, 1, false, 0, 1},
		{"POST with a key, body not rewindable", "POST", true, false, 2, false, 1, 0},
		{"POST with a key", "POST", true, true, 2, false, 0, 1},
		{"GET", "GET", false, true, 2, false, 0, 1},
		{"POST, RelayUnreplayable", "POST", false, true, 2, true, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := newFleet(t, 2, func(tr *Transport) {
				tr.MaxConnsPerKey = tc.maxConns
				tr.RelayUnreplayable = tc.relay
			})
			owner, client := ms[0], ms[1]
			warm(t, owner, srv.URL+"/warm")
			var body io.Reader
			if tc.method == "POST" {
				body = strings.NewReader("small")
				if !tc.rewindable {
					body = io.NopCloser(body)
				}
			}
			req, _ := http.NewRequest(tc.method, srv.URL+"/echo", body)
			if tc.key {
				req.Header.Set("Idempotency-Key", "1")
			}
			if !tc.rewindable {
				req.ContentLength = 5
			}
			resp, err := client.tr.RoundTrip(req)
			if err != nil {
				t.Fatal(err)
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if st := client.node.Stats(); st.Created != tc.created || st.ReusedRemote != tc.remoter {
				t.Errorf("created %d, through the sibling %d; want %d, %d", st.Created, st.ReusedRemote, tc.created, tc.remoter)
			}
		})
	}
}

// TestCreateBeforeRemoteDialsFirst: under CreateBeforeRemote every request
// does what a large body does under LocalFirst. With a sibling's idle
// connection there, a small request opens a connection of its own while the
// key's budget allows; with the budget spent it goes through the sibling;
// and when its dial fails (the upstream takes no new connection) it still
// goes through the sibling, as under LocalFirst.
func TestCreateBeforeRemoteDialsFirst(t *testing.T) {
	for _, tc := range []struct {
		name             string
		maxConns         int
		refuseNew        bool
		created, remoter uint64
	}{
		{"budget left", 2, false, 1, 0},
		{"budget spent", 1, false, 0, 1},
		{"dial refused", 2, true, 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(echoBody))
			defer srv.Close()
			ms := newFleet(t, 2, func(tr *Transport) {
				tr.MaxConnsPerKey = tc.maxConns
				tr.Policy = orbitpool.CreateBeforeRemote{}
			})
			owner, client := ms[0], ms[1]
			warm(t, owner, srv.URL+"/warm")
			if tc.refuseNew {
				// Connections made stay served; new ones are refused.
				srv.Listener.Close()
			}
			body := []byte("small")
			if got := postEcho(t, client.tr, srv.URL+"/echo", body); !bytes.Equal(got, body) {
				t.Fatalf("echo differs: %q", got)
			}
			if st := client.node.Stats(); st.Created != tc.created || st.ReusedRemote != tc.remoter {
				t.Errorf("created %d, through the sibling %d; want %d, %d", st.Created, st.ReusedRemote, tc.created, tc.remoter)
			}
		})
	}
}

// TestUnreplayableLearnsH1FromASibling: an https upstream that chooses
// http/1.1 by ALPN, with HTTP2 on. The owner dialed and learned it; the
// other process never dialed, so it takes the upstream for an HTTP/2 one,
// whose one connection carries every process's streams, and its first POST
// goes through the owner. The relayed answer tells it the connection spoke
// HTTP/1.1: its next POSTs dial one connection of their own and keep to it.
func TestUnreplayableLearnsH1FromASibling(t *testing.T) {
	ts := httptest.NewTLSServer(http.HandlerFunc(echoBody)) // http/1.1 only
	defer ts.Close()
	roots := x509.NewCertPool()
	roots.AddCert(ts.Certificate())
	ms := newFleet(t, 2, func(tr *Transport) {
		tr.HTTP2 = true
		tr.TLSClientConfig = &tls.Config{RootCAs: roots}
	})
	owner, client := ms[0], ms[1]
	warm(t, owner, ts.URL+"/warm")
	for range 5 {
		if got := postEcho(t, client.tr, ts.URL+"/echo", []byte("small")); string(got) != "small" {
			t.Fatalf("echo %q", got)
		}
	}
	if st := client.node.Stats(); st.Created != 1 || st.ReusedRemote != 1 {
		t.Errorf("5 POSTs in turn: created %d, through the sibling %d; want 1, 1", st.Created, st.ReusedRemote)
	}
}
