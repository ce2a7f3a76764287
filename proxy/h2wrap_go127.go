//go:build go1.27 && !http2legacy

package proxy

// h2Wrapped is true where x/net/http2's ClientConn wraps net/http's own
// HTTP/2 client (Go 1.27 and later, unless built with http2legacy: the same
// condition as x/net's). Its State reads the connection's counts without
// waiting for the write lock, reports GOAWAY only once the connection has
// closed, and its MaxConcurrentStreams is what may start plus what runs, not
// the peer's limit. See usableH2.
const h2Wrapped = true
