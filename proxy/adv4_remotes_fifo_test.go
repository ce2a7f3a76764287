package proxy

import (
	"context"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/orbitpool"
)

// TestAdv4RemotesFIFOBlocksNoRequest: open(O_WRONLY) of a FIFO with no
// reader blocks until one comes. With a FIFO in the addresses file's place,
// the request that first uses the upstream (setCap, literal address) or
// first dials it (the dial's seen, by name, holding its creation permit)
// must still end, and in time.
func TestAdv4RemotesFIFOBlocksNoRequest(t *testing.T) {
	srv := discardUpstream(t)
	port := srv.URL[strings.LastIndexByte(srv.URL, ':')+1:]
	for _, tc := range []struct{ name, url string }{
		{"literal", "http://127.0.0.1:" + port},  // setCap publishes, in Transport.upstream
		{"hostname", "http://localhost:" + port}, // the dial publishes, holding its permit
	} {
		t.Run(tc.name, func(t *testing.T) {
			ms := newFleet(t, 2, func(tr *Transport) { tr.MaxConnsPerKey = 1 })
			key := mustKey(t, &Transport{}, tc.url)
			path := ms[0].node.remotesFile(key)
			if err := syscall.Mkfifo(path, 0o600); err != nil {
				t.Fatal(err)
			}
			// Whatever happens, let a blocked opener go at the end.
			t.Cleanup(func() {
				if f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0); err == nil {
					time.Sleep(50 * time.Millisecond)
					f.Close()
				}
			})
			done := make(chan error, 1)
			go func() {
				ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
				defer cancel()
				resp, err := get(t, ctx, ms[0].tr, tc.url+"/")
				if err == nil {
					drain(resp)
				}
				done <- err
			}()
			select {
			case err := <-done:
				if err != nil {
					t.Fatalf("request with a FIFO for the addresses file: %v", err)
				}
			case <-time.After(5 * time.Second):
				creating := sumKeys(t, ms[1].pool, func(k orbitpool.KeyStats) int { return k.Creating })
				t.Fatalf("a request with a FIFO at %s did not end within 5s (its own deadline 3s), with %d creation permits out fleet-wide", path, creating)
			}
		})
	}
}
