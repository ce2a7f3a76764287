package caddymodule

import (
	"math"
	"strconv"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
	"github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddyconfig/httpcaddyfile"
	"github.com/caddyserver/caddy/v2/modules/caddyhttp/reverseproxy"
	"github.com/caddyserver/caddy/v2/modules/caddytls"
	"github.com/dustin/go-humanize"
)

func init() {
	httpcaddyfile.RegisterGlobalOption("orbit_pool", parseGlobalOption)
}

// parseGlobalOption turns the `orbit_pool` global option into the app.
func parseGlobalOption(d *caddyfile.Dispenser, existing any) (any, error) {
	if existing != nil {
		return nil, d.Err("orbit_pool is already configured")
	}
	app := new(App)
	if err := app.UnmarshalCaddyfile(d); err != nil {
		return nil, err
	}
	return httpcaddyfile.App{Name: "orbit_pool", Value: caddyconfig.JSON(app, nil)}, nil
}

// UnmarshalCaddyfile sets up the app from the `orbit_pool` global option.
// Every setting is optional; `orbit_pool` alone (or no global option at all,
// when a transport uses the app) means the defaults.
//
//	orbit_pool {
//	    segment              <path>
//	    socket_dir           <path>
//	    processes            <count>
//	    keys                 <count>
//	    conns_per_process    <count>
//	    policy               local_first|local_only
//	    max_conns_per_host   <count>
//	    max_dialing_per_host <count>
//	    wait_timeout         <duration>
//	    deadline_near_window <duration>
//	    max_in_flight        <count>
//	    workers              <count>
//	    memory_limit         <size>
//	    admission_ceiling    <count>
//	    reconcile_interval   <duration>
//	    reservation_timeout  <duration>
//	    drain_timeout        <duration>
//	    order_window         <count>
//	    reclaim_hold         <duration>
//	    fixed_ownership
//	    keep_segment
//	}
func (a *App) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume option name
	if d.NextArg() {
		return d.ArgErr()
	}
	for d.NextBlock(0) {
		opt := d.Val()
		var err error
		switch opt {
		case "segment":
			a.Segment, err = oneArg(d)
		case "socket_dir":
			a.SocketDir, err = oneArg(d)
		case "processes":
			a.Processes, err = intArg(d, 1)
		case "keys":
			a.Keys, err = intArg(d, 1)
		case "conns_per_process":
			a.ConnsPerProcess, err = intArg(d, 1)
		case "policy":
			a.Policy, err = oneArg(d)
			if err == nil && a.Policy != PolicyLocalFirst && a.Policy != PolicyLocalOnly {
				err = d.Errf("unknown policy '%s': want %s or %s", a.Policy, PolicyLocalFirst, PolicyLocalOnly)
			}
		case "max_conns_per_host":
			a.MaxConnsPerHost, err = intArg(d, 0)
		case "max_dialing_per_host":
			a.MaxDialingPerHost, err = intArg(d, 0)
		case "wait_timeout":
			a.WaitTimeout, err = durationArg(d, false)
		case "deadline_near_window":
			a.DeadlineNearWindow, err = durationArg(d, true)
		case "max_in_flight":
			var n int
			n, err = intArg(d, 0)
			a.MaxInFlight = &n
		case "workers":
			a.Workers, err = intArg(d, 1)
		case "memory_limit":
			a.MemoryLimit, err = sizeArg(d)
		case "admission_ceiling":
			a.AdmissionCeiling, err = intArg(d, 1)
		case "reconcile_interval":
			a.ReconcileInterval, err = durationArg(d, false)
		case "reservation_timeout":
			a.ReservationTimeout, err = durationArg(d, false)
		case "drain_timeout":
			a.DrainTimeout, err = durationArg(d, false)
		case "order_window":
			var n int
			n, err = intArg(d, 0)
			a.OrderWindow = &n
		case "reclaim_hold":
			var v caddy.Duration
			v, err = durationArg(d, true)
			a.ReclaimHold = &v
		case "fixed_ownership":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.FixedOwnership = true
		case "keep_segment":
			if d.NextArg() {
				return d.ArgErr()
			}
			a.KeepSegment = true
		default:
			return d.Errf("unrecognized orbit_pool option '%s'", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// UnmarshalCaddyfile sets up the transport from Caddyfile tokens. The TLS
// and keep-alive options are named as the `http` transport names them; the
// connection caps are fleet-wide and default to the `orbit_pool` global
// option's. `timeout` bounds the whole exchange; `deadline_header` names
// request headers carrying the client's own timeout (grpc-timeout format, or
// seconds), and may be given more than once; the request's deadline is the
// earliest of those, its context's and the server's write_timeout.
//
//	transport orbit_pool {
//	    dial_timeout            <duration>
//	    response_header_timeout <duration>
//	    expect_continue_timeout <duration>
//	    max_response_header     <size>
//	    max_conns_per_host      <count>
//	    max_dialing_per_host    <count>
//	    wait_timeout            <duration>
//	    timeout                 <duration>
//	    deadline_header         <header_name...>
//	    relay_unreplayable
//	    keepalive               off|<idle_duration>
//	    keepalive_interval      off|<interval>
//	    keepalive_max_lifetime  <duration>
//	    keepalive_max_requests  <count>
//	    versions                1.1|2|h2c...
//	    tls
//	    tls_client_auth         <automate_name> | <cert_file> <key_file>
//	    tls_insecure_skip_verify
//	    tls_curves              <curves...>
//	    tls_timeout             <duration>
//	    tls_trust_pool          <module> {
//	        ...
//	    }
//	    tls_server_name         <sni>
//	    tls_renegotiation       never|once|freely
//	    tls_except_ports        <ports...>
//	}
func (t *Transport) UnmarshalCaddyfile(d *caddyfile.Dispenser) error {
	d.Next() // consume transport name
	if d.NextArg() {
		return d.ArgErr()
	}
	tlsCfg := func() *reverseproxy.TLSConfig {
		if t.TLS == nil {
			t.TLS = new(reverseproxy.TLSConfig)
		}
		return t.TLS
	}
	keepAlive := func() *KeepAlive {
		if t.KeepAlive == nil {
			t.KeepAlive = new(KeepAlive)
		}
		return t.KeepAlive
	}
	for d.NextBlock(0) {
		opt := d.Val()
		var err error
		switch opt {
		case "dial_timeout":
			t.DialTimeout, err = durationArg(d, false)
		case "response_header_timeout":
			t.ResponseHeaderTimeout, err = durationArg(d, false)
		case "expect_continue_timeout":
			t.ExpectContinueTimeout, err = durationArg(d, false)
		case "max_response_header":
			var n uint64
			n, err = sizeArg(d)
			if err == nil && n > math.MaxInt64 {
				err = d.Errf("bad max_response_header value '%s': too large", d.Val())
			}
			t.MaxResponseHeaderSize = int64(n)
		case "max_conns_per_host":
			t.MaxConnsPerHost, err = intArg(d, 1)
		case "max_dialing_per_host":
			t.MaxDialingPerHost, err = intArg(d, 1)
		case "wait_timeout":
			t.WaitTimeout, err = durationArg(d, false)
		case "timeout":
			t.Timeout, err = durationArg(d, false)
		case "relay_unreplayable":
			if d.NextArg() {
				return d.ArgErr()
			}
			t.RelayUnreplayable = true
		case "deadline_header":
			names := d.RemainingArgs()
			if len(names) == 0 {
				return d.ArgErr()
			}
			for _, h := range names {
				if !validHeaderName(h) {
					return d.Errf("bad deadline_header value '%s': not a header name", h)
				}
			}
			t.DeadlineHeaders = append(t.DeadlineHeaders, names...)
		case "keepalive":
			var v string
			if v, err = oneArg(d); err != nil {
				break
			}
			if v == "off" {
				off := false
				keepAlive().Enabled = &off
				break
			}
			var dur time.Duration
			if dur, err = caddy.ParseDuration(v); err != nil || dur <= 0 {
				err = d.Errf("bad keepalive value '%s': want off or a positive duration", v)
				break
			}
			keepAlive().IdleConnTimeout = caddy.Duration(dur)
		case "keepalive_interval":
			if d.CountRemainingArgs() == 1 && d.NextArg() {
				if d.Val() == "off" {
					keepAlive().ProbeInterval = -1
					break
				}
				d.Prev()
			}
			var dur caddy.Duration
			dur, err = durationArg(d, false)
			keepAlive().ProbeInterval = dur
		case "keepalive_max_lifetime":
			var dur caddy.Duration
			dur, err = durationArg(d, false)
			keepAlive().MaxLifetime = dur
		case "keepalive_max_requests":
			var n int
			n, err = intArg(d, 1)
			keepAlive().MaxRequests = n
		case "versions":
			t.Versions = d.RemainingArgs()
			if len(t.Versions) == 0 {
				return d.ArgErr()
			}
			if err := checkVersions(t.Versions); err != nil {
				return d.Err(err.Error())
			}
		case "tls":
			if d.NextArg() {
				return d.ArgErr()
			}
			tlsCfg()
		case "tls_client_auth":
			args := d.RemainingArgs()
			switch len(args) {
			case 1:
				tlsCfg().ClientCertificateAutomate = args[0]
			case 2:
				tlsCfg().ClientCertificateFile = args[0]
				tlsCfg().ClientCertificateKeyFile = args[1]
			default:
				return d.ArgErr()
			}
		case "tls_insecure_skip_verify":
			if d.NextArg() {
				return d.ArgErr()
			}
			tlsCfg().InsecureSkipVerify = true
		case "tls_curves":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			tlsCfg().Curves = args
		case "tls_timeout":
			var dur caddy.Duration
			dur, err = durationArg(d, false)
			tlsCfg().HandshakeTimeout = dur
		case "tls_trust_pool":
			if !d.NextArg() {
				return d.ArgErr()
			}
			modStem := d.Val()
			modID := "tls.ca_pool.source." + modStem
			unm, err := caddyfile.UnmarshalModule(d, modID)
			if err != nil {
				return err
			}
			ca, ok := unm.(caddytls.CA)
			if !ok {
				return d.Errf("module %s is not a caddytls.CA", modID)
			}
			if tlsCfg().CARaw != nil {
				return d.Err("cannot specify tls_trust_pool twice")
			}
			t.TLS.CARaw = caddyconfig.JSONModuleObject(ca, "provider", modStem, nil)
		case "tls_server_name":
			var v string
			v, err = oneArg(d)
			tlsCfg().ServerName = v
		case "tls_renegotiation":
			var v string
			if v, err = oneArg(d); err != nil {
				break
			}
			switch v {
			case "never", "once", "freely":
				tlsCfg().Renegotiation = v
			default:
				err = d.Errf("bad tls_renegotiation value '%s': want never, once or freely", v)
			}
		case "tls_except_ports":
			args := d.RemainingArgs()
			if len(args) == 0 {
				return d.ArgErr()
			}
			tlsCfg().ExceptPorts = args
		default:
			return d.Errf("unrecognized orbit_pool transport option '%s'", opt)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// oneArg reads the option's single argument.
func oneArg(d *caddyfile.Dispenser) (string, error) {
	if !d.NextArg() {
		return "", d.ArgErr()
	}
	v := d.Val()
	if d.NextArg() {
		return "", d.ArgErr()
	}
	return v, nil
}

// intArg reads the option's single argument as an integer of at least min.
func intArg(d *caddyfile.Dispenser, min int) (int, error) {
	opt := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := strconv.Atoi(v)
	if err != nil {
		return 0, d.Errf("bad %s value '%s': not an integer", opt, v)
	}
	if n < min {
		return 0, d.Errf("bad %s value '%s': must be at least %d", opt, v, min)
	}
	return n, nil
}

// durationArg reads the option's single argument as a positive duration,
// or also zero when zeroOK.
func durationArg(d *caddyfile.Dispenser, zeroOK bool) (caddy.Duration, error) {
	opt := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	dur, err := caddy.ParseDuration(v)
	if err != nil {
		return 0, d.Errf("bad %s value '%s': %v", opt, v, err)
	}
	if dur < 0 || (dur == 0 && !zeroOK) {
		return 0, d.Errf("bad %s value '%s': must be positive", opt, v)
	}
	return caddy.Duration(dur), nil
}

// sizeArg reads the option's single argument as a size in bytes (a number,
// optionally with a unit such as 64KiB or 1MB).
func sizeArg(d *caddyfile.Dispenser) (uint64, error) {
	opt := d.Val()
	v, err := oneArg(d)
	if err != nil {
		return 0, err
	}
	n, err := humanize.ParseBytes(v)
	if err != nil {
		return 0, d.Errf("bad %s value '%s': %v", opt, v, err)
	}
	if n == 0 {
		return 0, d.Errf("bad %s value '%s': must be positive", opt, v)
	}
	return n, nil
}

// Interface guards
var (
	_ caddyfile.Unmarshaler = (*App)(nil)
	_ caddyfile.Unmarshaler = (*Transport)(nil)
)
