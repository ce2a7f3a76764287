package caddymodule

import (
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitproxy/orbit/proxy"
)

// TestAdv4RemotesLastMemberRemovesSocketDir: members that published
// upstream addresses (remotes-*) leave; the last one's Destruct removes the
// files and then the socket directory.
func TestAdv4RemotesLastMemberRemovesSocketDir(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	dir := t.TempDir()
	a := &App{Segment: filepath.Join(dir, "seg"), SocketDir: filepath.Join(dir, "sock"), Processes: 4, Keys: 16, ConnsPerProcess: 16}
	a.setDefaults()
	cfg := a.fleetConfig()
	var fs []*fleet
	for range 2 {
		f, err := openFleet(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		fs = append(fs, f)
		tr := &proxy.Transport{Node: f.node}
		req, _ := http.NewRequest("GET", up.URL+"/", nil)
		resp, err := tr.RoundTrip(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		tr.CloseIdleConnections()
	}
	ents, _ := os.ReadDir(cfg.SocketDir)
	var remotes int
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "remotes-") {
			remotes++
		}
	}
	if remotes != 1 {
		t.Fatalf("socket dir holds %d remotes files before leaving, want 1: %v", remotes, ents)
	}
	fs[0].Destruct()
	if _, err := os.Stat(cfg.SocketDir); err != nil {
		t.Fatalf("the socket dir went with a member still in the fleet: %v", err)
	}
	fs[1].Destruct()
	if _, err := os.Stat(cfg.SocketDir); !os.IsNotExist(err) {
		ents, _ := os.ReadDir(cfg.SocketDir)
		t.Fatalf("after the last member left, the socket dir: %v, holding %v", err, ents)
	}
}
