package proxy

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"net/netip"
	"syscall"
	"time"
)

// upstream names one upstream and how to reach it: everything in it goes into
// the pool Key, because anything that changes the wire forbids reuse.
type upstream struct {
	// Scheme is "http" or "https".
	Scheme string
	// Addr is the dial address, host:port.
	Addr string
	// ServerName is the TLS server name (SNI and verification); empty means
	// the host of Addr.
	ServerName string
	// TLS is the client TLS configuration for https; its certificates are the
	// client identity. Nil means defaults.
	TLS *tls.Config
	// Proto is the protocol spoken: protoHTTP1, protoHTTP2 (https, by
	// ALPN) or protoH2C (http, with prior knowledge).
	Proto string
}

// dialer makes upstream connections.
type dialer struct {
	timeout   time.Duration
	keepAlive time.Duration
	sessions  tls.ClientSessionCache
}

const defaultDialTimeout = 10 * time.Second

// dial connects to u within the dial timeout and, for https, completes the
// TLS handshake, resuming a session from the cache when it can. Every
// failure here is retry-safe: no request byte was sent. seen, if not nil,
// learns each address dial connects to before it does: a process that dies
// before its connection is made, or during its handshake, leaves a
// connection the upstream may count, and the fleet must know where to.
func (d *dialer) dial(ctx context.Context, u *upstream, seen func(netip.AddrPort)) (*conn, error) {
	timeout := d.timeout
	if timeout <= 0 {
		timeout = defaultDialTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	nd := net.Dialer{KeepAlive: d.keepAlive}
	if seen != nil {
		nd.ControlContext = func(_ context.Context, _, address string, _ syscall.RawConn) error {
			if a, err := netip.ParseAddrPort(address); err == nil {
				seen(a)
			}
			return nil
		}
	}
	raw, err := nd.DialContext(ctx, "tcp", u.Addr)
	if err != nil {
		return nil, &Error{Op: "dial", RetrySafe: true, Err: err}
	}
	// An HTTP/2 connection's reads are watched (see h2Watch); TLS reads
	// through the watch, so that x/net/http2 still sees the *tls.Conn.
	var w *h2Watch
	under := raw
	if u.Proto == protoH2C || u.Proto == protoHTTP2 {
		w = newH2Watch(raw)
		under = w
	}
	if u.Scheme != "https" {
		c := newConn(under, raw)
		c.watch = w
		return c, nil
	}
	cfg := d.tlsConfig(u)
	tc := tls.Client(under, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		raw.Close()
		return nil, &Error{Op: "dial", RetrySafe: true, Err: fmt.Errorf("tls handshake: %w", err)}
	}
	c := newConn(tc, raw)
	c.watch = w
	return c, nil
}

func (d *dialer) tlsConfig(u *upstream) *tls.Config {
	var cfg *tls.Config
	if u.TLS != nil {
		cfg = u.TLS.Clone()
	} else {
		cfg = &tls.Config{}
	}
	if cfg.ServerName == "" {
		cfg.ServerName = u.ServerName
	}
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(u.Addr)
		if err != nil {
			host = u.Addr
		}
		cfg.ServerName = host
	}
	if cfg.ClientSessionCache == nil {
		cfg.ClientSessionCache = d.sessions
	}
	cfg.NextProtos = tlsNextProtos(u)
	return cfg
}
