package proxy

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/orbitproxy/orbit/governor"
)

// TestAdvLargeBodyDialFailsUsesSibling: a large-body request that prefers a
// connection of its own, and cannot have one (the upstream takes no new
// connections, or this process's admission backstop refuses the dial),
// still goes through a sibling's idle connection, as any other request
// does: preferring to dial must not turn into failing when dialing fails.
func TestAdvLargeBodyDialFailsUsesSibling(t *testing.T) {
	for _, mode := range []string{"refused", "not admitted"} {
		t.Run(mode, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(echoBody))
			defer srv.Close()
			other := httptest.NewServer(http.HandlerFunc(echoBody))
			defer other.Close()
			spec := testSpec
			spec.Path = filepath.Join(t.TempDir(), "seg")
			conf := func(tr *Transport) { tr.MaxConnsPerKey = 4 }
			owner := newMember(t, spec, conf)
			opts := NodeOptions{SweepInterval: 50 * time.Millisecond}
			if mode == "not admitted" {
				opts.Admission = governor.NewAdmission(1)
			}
			client := newMemberOpts(t, spec, opts, conf)
			warm(t, owner, srv.URL+"/warm")
			switch mode {
			case "refused":
				// Connections made stay served; new ones are refused.
				srv.Listener.Close()
			case "not admitted":
				// The client's one admitted connection, to another upstream.
				warm(t, client, other.URL+"/warm")
			}
			for _, size := range []int{largeBody - 1, largeBody} {
				body := randomBytes(size)
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/echo", bytes.NewReader(body))
				resp, err := client.tr.RoundTrip(req)
				if err != nil {
					cancel()
					t.Fatalf("%d bytes: %v (an idle sibling connection was there)", size, err)
				}
				got, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				cancel()
				if err != nil || !bytes.Equal(got, body) {
					t.Fatalf("%d bytes: echo differs: %d bytes, %v", size, len(got), err)
				}
			}
		})
	}
}
