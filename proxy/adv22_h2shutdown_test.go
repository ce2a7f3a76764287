package proxy

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/internal/grpcmsg"
)

// adv22Stream is a bidi echo stream in progress.
type adv22Stream struct {
	pw   *io.PipeWriter
	resp *http.Response
}

func adv22Open(t *testing.T, rt http.RoundTripper, ctx context.Context, url string) *adv22Stream {
	t.Helper()
	s, err := adv22OpenErr(t, rt, ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func adv22OpenErr(t *testing.T, rt http.RoundTripper, ctx context.Context, url string) (*adv22Stream, error) {
	pr, pw := io.Pipe()
	req := grpcReq(t, ctx, url, pr)
	got, errc := headAsync(rt, req)
	go pw.Write(grpcmsg.Frame([]byte("hello")))
	select {
	case resp := <-got:
		s := &adv22Stream{pw: pw, resp: resp}
		if p, err := grpcmsg.Read(resp.Body); err != nil || string(p) != "hello" {
			resp.Body.Close()
			return nil, fmt.Errorf("first message: %q, %v", p, err)
		}
		return s, nil
	case err := <-errc:
		return nil, err
	case <-time.After(5 * time.Second):
		if f := os.Getenv("ADV22_STACKS"); f != "" {
			buf := make([]byte, 8<<20)
			os.WriteFile(f, buf[:runtime.Stack(buf, true)], 0o644)
		}
		return nil, fmt.Errorf("no response head")
	}
}

// exchange sends and reads back one message, then (last) ends the stream
// and wants grpc-status 0.
func (s *adv22Stream) exchange(msg string, last bool) error {
	errc := make(chan error, 1)
	go func() {
		if _, err := s.pw.Write(grpcmsg.Frame([]byte(msg))); err != nil {
			errc <- fmt.Errorf("write: %w", err)
			return
		}
		p, err := grpcmsg.Read(s.resp.Body)
		if err != nil || string(p) != msg {
			errc <- fmt.Errorf("read %q, %v", p, err)
			return
		}
		if last {
			s.pw.Close()
			if _, err := io.Copy(io.Discard, s.resp.Body); err != nil {
				errc <- fmt.Errorf("end: %w", err)
				return
			}
			if g := s.resp.Trailer.Get("Grpc-Status"); g != "0" {
				errc <- fmt.Errorf("trailers %v", s.resp.Trailer)
				return
			}
		}
		errc <- nil
	}()
	select {
	case err := <-errc:
		return err
	case <-time.After(3 * time.Second):
		return fmt.Errorf("exchange of %q hangs", msg)
	}
}

type adv22Up struct {
	url  string
	conf func(*Transport)
}

func adv22Ups(t *testing.T) map[string]func(t *testing.T) adv22Up {
	return map[string]func(t *testing.T) adv22Up{
		"h2c": func(t *testing.T) adv22Up {
			up := newH2Upstream(t, 100)
			return adv22Up{up.url, h2cConf}
		},
		"tls": func(t *testing.T) adv22Up {
			up := newTLSUpstream(t, true, 100)
			return adv22Up{up.url, tlsConf(up)}
		},
	}
}

// TestAdv22H2ShutdownWithStreams: the owner's Shutdown, with one stream of
// its own and one of a sibling's running on its HTTP/2 connection, lets the
// sibling's stream finish (Shutdown waits for siblings' exchanges), fails
// its own cleanly at the latest when it closes, returns, and leaves no
// connection in the pool and no goroutine behind.
func TestAdv22H2ShutdownWithStreams(t *testing.T) {
	for name, mk := range adv22Ups(t) {
		t.Run(name, func(t *testing.T) {
			up := mk(t)
			owner, client := remotePair(t, up.conf)
			key := mustKey(t, owner.tr, up.url)
			g0 := runtime.NumGoroutine()
			local := adv22Open(t, owner.tr, context.Background(), up.url+"/echo")
			remote := adv22Open(t, client.tr, context.Background(), up.url+"/echo")
			if client.node.Stats().ReusedRemote != 1 {
				t.Fatalf("the sibling's stream did not go through the owner: %+v", client.node.Stats())
			}
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				done <- owner.node.Shutdown(ctx)
			}()
			time.Sleep(100 * time.Millisecond)
			select {
			case err := <-done:
				t.Fatalf("Shutdown returned (%v) with a sibling's stream running", err)
			default:
			}
			// A new request from the sibling while the owner shuts down:
			// refused by the owner, it must be served once the fleet has
			// room (the owner's connection gone), within its deadline.
			late := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "GET", up.url+"/echo", nil)
				resp, err := client.tr.RoundTrip(req)
				if err == nil {
					_, err = io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				late <- err
			}()
			time.Sleep(50 * time.Millisecond)
			if err := remote.exchange("r1", false); err != nil {
				t.Fatalf("sibling's stream during Shutdown: %v", err)
			}
			if err := remote.exchange("r2", true); err != nil {
				t.Fatalf("sibling's stream end during Shutdown: %v", err)
			}
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("Shutdown: %v", err)
				}
			case <-time.After(3 * time.Second):
				t.Fatal("Shutdown did not return after the sibling's stream ended")
			}
			select {
			case err := <-late:
				if err != nil {
					t.Errorf("the sibling's request sent during the owner's Shutdown: %v", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the sibling's request sent during the owner's Shutdown hangs past its deadline")
			}
			// The owner's own stream: fails now (its connection closed), but
			// does not hang.
			err := local.exchange("l1", true)
			t.Logf("h2Wrapped=%v owner's own stream after Shutdown: %v", h2Wrapped, err)
			local.resp.Body.Close()
			remote.resp.Body.Close()
			// The sibling's late request dialed a connection of its own,
			// idle now: once it closes idle ones, nothing is live.
			client.tr.CloseIdleConnections()
			dl := time.Now().Add(2 * time.Second)
			for owner.pool.Live(key) != 0 && time.Now().Before(dl) {
				time.Sleep(5 * time.Millisecond)
			}
			if n := owner.pool.Live(key); n != 0 {
				t.Errorf("pool.Live %d after Shutdown and the sibling's CloseIdleConnections", n)
			}
			goroutinesBackTo(t, g0)
		})
	}
}

// TestAdv22H2CloseWithStreams: Close on the owner with streams running on
// its HTTP/2 connection (one local, one a sibling's) fails them promptly;
// Close on the sibling leaves them to finish; neither hangs anything or
// leaks.
func TestAdv22H2CloseWithStreams(t *testing.T) {
	for name, mk := range adv22Ups(t) {
		for _, who := range []string{"owner", "sibling"} {
			t.Run(name+"/"+who, func(t *testing.T) {
				up := mk(t)
				owner, client := remotePair(t, up.conf)
				key := mustKey(t, owner.tr, up.url)
				g0 := runtime.NumGoroutine()
				local := adv22Open(t, owner.tr, context.Background(), up.url+"/echo")
				remote := adv22Open(t, client.tr, context.Background(), up.url+"/echo")
				closer := owner.node
				if who == "sibling" {
					closer = client.node
				}
				cdone := make(chan error, 1)
				go func() { cdone <- closer.Close() }()
				select {
				case <-cdone:
				case <-time.After(3 * time.Second):
					t.Fatal("Close hangs with streams running")
				}
				rerr := remote.exchange("r1", true)
				lerr := local.exchange("l1", true)
				t.Logf("h2Wrapped=%v after %s Close: sibling's stream %v; owner's stream %v", h2Wrapped, who, rerr, lerr)
				if who == "owner" && rerr == nil {
					// (A sibling's own Close leaves its exchanges with the
					// owner to finish: Close closes what the process owns.)
					t.Errorf("the sibling's stream went on after the owner's Close")
				}
				if who == "owner" && lerr == nil {
					t.Errorf("the owner's stream went on after its Close")
				}
				if rerr != nil && (contains(rerr.Error(), "hangs")) || lerr != nil && contains(lerr.Error(), "hangs") {
					t.Errorf("a stream hangs after Close: %v / %v", rerr, lerr)
				}
				local.resp.Body.Close()
				remote.resp.Body.Close()
				if who == "owner" {
					if n := owner.pool.Live(key); n != 0 {
						t.Errorf("pool.Live %d after the owner's Close", n)
					}
				} else {
					// The owner's connection comes back to its pool, unused.
					waitFor(t, 3*time.Second, "the sibling's unit to come back", func() bool {
						c, _ := owner.pool.Candidates(key, nil)
						for _, r := range c {
							if r.InUse != 0 || r.Pending != 0 {
								return false
							}
						}
						return true
					})
					owner.node.Close()
				}
				goroutinesBackTo(t, g0)
			})
		}
	}
}

func contains(s, sub string) bool {
	return len(sub) == 0 || len(s) >= len(sub) && (s[:len(sub)] == sub || contains(s[1:], sub))
}
