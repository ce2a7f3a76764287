// Package fleet runs a fleet of Caddy workers on one host: the
// `caddy orbit-fleet` command's supervisor, which starts, restarts, reloads
// and stops the workers, and the listening sockets it holds for them, which
// outlive any one worker so that no queued client connection is reset when a
// worker reloads or dies, and which a stopping worker drains before it lets
// go of them.
//
// The workers are ordinary Caddy processes of the same binary. What makes
// them share upstream connections is the orbit_pool app and transport in
// their configuration (package caddymodule); this package only hands each
// worker its sockets, its admin endpoint and the fleet's identity.
package fleet

import (
	"hash/fnv"
	"os"
)

// idEnv names the fleet a supervised worker belongs to: its supervisor's
// run directory and pid.
const idEnv = "ORBIT_FLEET_ID"

// Tag is what a worker publishes in its pool lane to say which fleet it
// belongs to: a digest of the fleet's identity, or 0 in a process no
// supervisor started.
func Tag() uint64 {
	id := os.Getenv(idEnv)
	if id == "" {
		return 0
	}
	h := fnv.New64a()
	h.Write([]byte(id))
	return h.Sum64() | 1
}
