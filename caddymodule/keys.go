package caddymodule

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"net"
	"slices"
	"strings"
	"sync"

	"github.com/orbitproxy/orbit/orbitpool"
)

// poolKey is the pool Key the proxy transport files a request to
// scheme://addr under, for a transport with the given TLS config and key
// extra. The pool table knows upstreams only by key; this is how the metrics
// and the admin API put a name on the keys this process has sent requests to.
//
// It must derive the key exactly as the proxy package does (a length-prefixed
// SHA-256 of the scheme, address, TLS server name, verification and client
// certificates, and the extra). The proxy package does not export its
// derivation yet; TestPoolKeyMatchesProxy checks the two agree.
func poolKey(scheme, addr string, cfg *tls.Config, extra string) orbitpool.Key {
	h := sha256.New()
	field := func(s string) {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field("orbit-key/1")
	field(strings.ToLower(scheme))
	field(strings.ToLower(addr))
	if scheme == "https" {
		if cfg == nil {
			cfg = &tls.Config{}
		}
		serverName := cfg.ServerName
		if serverName == "" {
			host, _, err := net.SplitHostPort(addr)
			if err != nil {
				host = addr
			}
			serverName = host
		}
		field(strings.ToLower(serverName))
		if cfg.InsecureSkipVerify {
			field("insecure")
		} else {
			field("verify")
		}
		for _, cert := range cfg.Certificates {
			if len(cert.Certificate) > 0 {
				sum := sha256.Sum256(cert.Certificate[0])
				field(string(sum[:]))
			}
		}
	}
	field(extra)
	sum := h.Sum(nil)
	return orbitpool.Key{Hi: binary.BigEndian.Uint64(sum[0:8]), Lo: binary.BigEndian.Uint64(sum[8:16])}
}

// keyNames maps the pool keys this process has sent requests to onto the
// upstreams' names (scheme://host:port). A key another process named but
// this one never used has no name here.
var keyNames sync.Map // orbitpool.Key -> *nameSet

type nameSet struct {
	mu    sync.Mutex
	names []string
}

func nameKey(k orbitpool.Key, name string) {
	v, _ := keyNames.LoadOrStore(k, new(nameSet))
	ns := v.(*nameSet)
	ns.mu.Lock()
	defer ns.mu.Unlock()
	if !slices.Contains(ns.names, name) {
		ns.names = append(ns.names, name)
		slices.Sort(ns.names)
	}
}

// upstreamNames returns the names known for k, sorted.
func upstreamNames(k orbitpool.Key) []string {
	v, ok := keyNames.Load(k)
	if !ok {
		return nil
	}
	ns := v.(*nameSet)
	ns.mu.Lock()
	defer ns.mu.Unlock()
	return slices.Clone(ns.names)
}
