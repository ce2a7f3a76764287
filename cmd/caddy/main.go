// Command caddy is Caddy with its standard modules and orbit's: the
// `orbit_pool` app and reverse_proxy transport, the /orbit_pool/ admin route
// and the `caddy orbit-fleet` command.
//
//	go build ./cmd/caddy
//
// builds it; no xcaddy needed. See README.md beside this file.
package main

import (
	caddycmd "github.com/caddyserver/caddy/v2/cmd"

	// Caddy's standard modules.
	_ "github.com/caddyserver/caddy/v2/modules/standard"

	// orbit's modules.
	_ "github.com/orbitproxy/orbit/caddymodule"
)

func main() {
	caddycmd.Main()
}
