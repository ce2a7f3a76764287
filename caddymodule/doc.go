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
// status (503 or 504) rather than a late failure. A request that could not be
// sent again if the sibling died during its exchange (one with a body, as
// reverse_proxy gives the transport no way to read a body twice, or a POST
// without an Idempotency-Key), or that carries 1 MiB or more, dials before
// it reserves a sibling's HTTP/1.1 connection. Load balancing, health
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
// # Deadlines and budgets
//
// Every request through the transport has a deadline when anything gives it
// one: the earliest of its context's deadline, a header the transport names
// (deadline_header, in grpc-timeout's format or in seconds, see
// ParseTimeout), the transport's timeout (the whole exchange) and the
// server's write_timeout. {http.vars.orbit_pool_deadline_source} says which
// (context, header, timeout, write_timeout, or none); without one the
// request waits up to wait_timeout, as it always did. With one, each claim
// point judges it as seed 001 says: past it, 504 at once; within
// deadline_near_window of it, 503 at once without Retry-After, and nothing
// goes upstream; a wait (for a back-pressure permit, a worker of the budget,
// a connection) ends at the earlier of the deadline less the window and
// wait_timeout. The deadline travels to a sibling that forwards the request:
// the sibling waits for a worker of its own budget only until then (at most
// half the reservation_timeout without one) and otherwise rejects the lease,
// giving it back at once, and the request tries another plan without that
// sibling.
//
// The app's workers and memory_limit are the process's one budget (package
// governor): every exchange, the process's own and each it forwards for a
// sibling, holds a worker and its buffers' memory while it runs, and a large
// upload asks for several buffers and streams with fewer when memory is
// short, never none. The admission backstop (admission_ceiling) is asked
// before a new upstream connection is dialed and before a sibling's lease is
// taken up.
//
// Refusals reach the client as caddyhttp errors: 503 when the upstream's
// connections, the process's in-flight cap, its budget, the admission
// backstop or the request's remaining time leave no room, 504 when the
// request's deadline passed. Each has its own reason, in the error, in
// {http.vars.orbit_pool_refusal} and in caddy_orbit_pool_refused_total:
// saturated, draining, wait_timeout, busy, budget, creating, policy,
// admission, owner_busy, table_full, deadline_near, deadline_elapsed. A transport cannot
// write response headers, so the suggested Retry-After is published in the
// placeholder {http.vars.orbit_pool_retry_after} (whole seconds) for a
// handle_errors route to send; Caddyfile.example shows one. As with any
// transport error, reverse_proxy's passive health checks count a refusal as a
// failure of the upstream.
package caddymodule
