// Package caddymodule plugs orbit into Caddy: the `orbit_pool` app, which
// joins this process to a fleet of Caddy processes sharing one pool table in
// shared memory, and the `orbit_pool` reverse_proxy transport, which sends
// requests over the fleet's shared upstream connections.
//
// Changing a reverse_proxy's transport is all it takes:
//
//	reverse_proxy 10.0.0.5:8080 {
//		transport orbit_pool
//	}
//
// Every Caddy process on the host that names the same segment (by default
// /dev/shm/orbit-pool) then shares its upstream connections: a request takes
// a connection of its own process, else reserves a sibling's and has the
// sibling forward it, else dials one within the upstream's fleet-wide budget,
// else waits for capacity until its wait timeout, and is refused with a clear
// status (503 or 504) rather than a late failure. Load balancing, health
// checks, retries, header manipulation, streaming and WebSockets are
// reverse_proxy's and keep working unchanged.
//
// Protocols: HTTP/1.1 by default; `versions` takes what the stock `http`
// transport takes but "3": "2" speaks HTTP/2 to TLS upstreams (by ALPN),
// "h2c" speaks HTTP/2 with prior knowledge to cleartext ones, and an
// h2c:// upstream address implies `versions h2c 2`, as with stock. An
// HTTP/1.1 connection carries one request at a time; an HTTP/2 connection
// is one pooled resource with as many streams as the upstream's
// SETTINGS_MAX_CONCURRENT_STREAMS, which requests of every worker reserve
// (a sibling's stream is relayed by the connection's owner, full-duplex,
// trailers included, so gRPC streaming works). max_conns_per_host counts
// connections of either kind; HTTP/1.1 and HTTP/2 connections of one
// upstream are pooled apart.
//
// The fleet-wide settings live in the `orbit_pool` global option (JSON: the
// `orbit_pool` app); without one, the defaults apply. The package also
// provides:
//
//   - Prometheus metrics in Caddy's registry: caddy_orbit_pool_fleet_* are
//     read from the shared table at scrape time and describe the whole fleet
//     (every worker reports the same value: aggregate with max, not sum);
//     the other caddy_orbit_pool_* are each process's own and sum over
//     workers. upstream_info names the upstream each key stands for, as
//     any member learnt it;
//   - the admin API route GET /orbit_pool/, the fleet's table as JSON.
//
// Importing it also registers the `caddy orbit-fleet` command (package fleet),
// which runs N workers of this binary on one port.
//
// Refusals reach the client as caddyhttp errors: 503 when the upstream's
// connections, the process's in-flight cap or the request's remaining time
// leave no room, 504 when the request's deadline passed. A transport cannot
// write response headers, so the suggested Retry-After is published in the
// placeholder {http.vars.orbit_pool_retry_after} (whole seconds) for a
// handle_errors route to send; Caddyfile.example shows one. As with any
// transport error, reverse_proxy's passive health checks count a refusal as a
// failure of the upstream.
package caddymodule
