// Package orbit lets a fleet of Caddy processes on one Linux host share their
// upstream connections. Importing it registers orbit's Caddy modules, so that
// the usual plugin build works with the module path alone:
//
//	xcaddy build v2.11.9 --with github.com/orbitproxy/orbit
//
// The parts are packages of their own: orbitpool (the fleet's pool table in
// shared memory), governor and backpressure (the process's budget and
// deadline-aware permits), proxy (an http.RoundTripper over the pool, usable
// without Caddy), caddymodule (the orbit_pool app and transport) and fleet
// (the `caddy orbit-fleet` supervisor).
package orbit

import _ "github.com/orbitproxy/orbit/caddymodule" // registers the Caddy modules
