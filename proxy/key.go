package proxy

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"net"
	"strings"

	"github.com/orbitproxy/orbit/orbitpool"
)

// KeyFor is the pool Key under which a Transport with tlsConfig and keyExtra
// files its connections to scheme://addr (addr is host:port). Embedders use it
// to put a name on the keys they see in the pool table.
func KeyFor(scheme, addr string, tlsConfig *tls.Config, keyExtra string) orbitpool.Key {
	u := upstream{Scheme: strings.ToLower(scheme), Addr: addr, TLS: tlsConfig}
	return keyFor(&u, effectiveServerName(&u), keyExtra)
}

// keyFor is the pool Key of an upstream: a digest of everything that forbids
// reusing one connection for another request. It must be stable across
// processes and restarts (siblings compute it independently), so it is
// SHA-256 truncated to 128 bits, never a per-process seeded hash.
//
// It covers the scheme, the dial address, the TLS server name, whether the
// certificate is verified, the client certificates (the client identity), and
// extra, the caller's own discriminator for anything else that changes the
// wire (a PROXY protocol client address, say).
func keyFor(u *upstream, serverName string, extra string) orbitpool.Key {
	h := sha256.New()
	field := func(s string) {
		var n [4]byte
		binary.BigEndian.PutUint32(n[:], uint32(len(s)))
		h.Write(n[:])
		h.Write([]byte(s))
	}
	field("orbit-key/1")
	field(strings.ToLower(u.Scheme))
	field(strings.ToLower(u.Addr))
	if u.Scheme == "https" {
		field(strings.ToLower(serverName))
		cfg := u.TLS
		if cfg == nil {
			cfg = &tls.Config{}
		}
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
	if u.Proto != protoHTTP1 {
		// HTTP/1.1 keys stay as they were; HTTP/2 pools are apart.
		field("proto:" + u.Proto)
	}
	sum := h.Sum(nil)
	return orbitpool.Key{Hi: binary.BigEndian.Uint64(sum[0:8]), Lo: binary.BigEndian.Uint64(sum[8:16])}
}

// effectiveServerName is the TLS server name a dial to u uses.
func effectiveServerName(u *upstream) string {
	if u.TLS != nil && u.TLS.ServerName != "" {
		return u.TLS.ServerName
	}
	if u.ServerName != "" {
		return u.ServerName
	}
	host, _, err := net.SplitHostPort(u.Addr)
	if err != nil {
		return u.Addr
	}
	return host
}
