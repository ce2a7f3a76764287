//go:build !(go1.27 && !http2legacy)

package proxy

// h2Wrapped: see h2wrap_go127.go. Here x/net/http2 runs its own client.
const h2Wrapped = false
