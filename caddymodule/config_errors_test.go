package caddymodule

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2"
	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// appBlock is a Caddyfile with the orbit_pool global option holding opts.
func appBlock(opts string) string {
	return "{\n\torbit_pool {\n\t\t" + opts + "\n\t}\n}\n:8080 {\n\trespond ok\n}\n"
}

// transportBlock is a Caddyfile whose reverse_proxy has an orbit_pool
// transport holding opts.
func transportBlock(opts string) string {
	return ":8080 {\n\treverse_proxy 127.0.0.1:9000 {\n\t\ttransport orbit_pool {\n\t\t\t" + opts + "\n\t\t}\n\t}\n}\n"
}

// TestCaddyfileErrors checks the message of every Caddyfile mistake the app
// and the transport reject while adapting.
func TestCaddyfileErrors(t *testing.T) {
	for _, tc := range []struct {
		name, caddyfile, want string
	}{
		{"app argument", "{\n\torbit_pool extra\n}\n:8080 {\n\trespond ok\n}\n", "wrong argument count"},
		{"app twice", "{\n\torbit_pool\n\torbit_pool\n}\n:8080 {\n\trespond ok\n}\n", "orbit_pool is already configured"},
		{"app unknown", appBlock("bogus 1"), "unrecognized orbit_pool option 'bogus'"},
		{"segment missing", appBlock("segment"), "wrong argument count"},
		{"segment extra", appBlock("segment /a /b"), "wrong argument count"},
		{"socket_dir missing", appBlock("socket_dir"), "wrong argument count"},
		{"processes not int", appBlock("processes many"), "bad processes value 'many': not an integer"},
		{"processes zero", appBlock("processes 0"), "bad processes value '0': must be at least 1"},
		{"keys zero", appBlock("keys 0"), "bad keys value '0': must be at least 1"},
		{"conns_per_process", appBlock("conns_per_process x"), "bad conns_per_process value 'x': not an integer"},
		{"policy", appBlock("policy random"), "unknown policy 'random': want local_first or local_only"},
		{"policy missing", appBlock("policy"), "wrong argument count"},
		{"max_conns_per_host", appBlock("max_conns_per_host -1"), "bad max_conns_per_host value '-1': must be at least 0"},
		{"max_dialing_per_host", appBlock("max_dialing_per_host x"), "bad max_dialing_per_host value 'x': not an integer"},
		{"wait_timeout bad", appBlock("wait_timeout soon"), "bad wait_timeout value 'soon'"},
		{"wait_timeout zero", appBlock("wait_timeout 0"), "bad wait_timeout value '0': must be positive"},
		{"deadline_near_window", appBlock("deadline_near_window -1s"), "bad deadline_near_window value '-1s': must be positive"},
		{"max_in_flight", appBlock("max_in_flight -1"), "bad max_in_flight value '-1': must be at least 0"},
		{"workers", appBlock("workers 0"), "bad workers value '0': must be at least 1"},
		{"memory_limit bad", appBlock("memory_limit lots"), "bad memory_limit value 'lots'"},
		{"memory_limit zero", appBlock("memory_limit 0"), "bad memory_limit value '0': must be positive"},
		{"admission_ceiling zero", appBlock("admission_ceiling 0"), "bad admission_ceiling value '0': must be at least 1"},
		{"admission_ceiling bad", appBlock("admission_ceiling lots"), "bad admission_ceiling value 'lots': not an integer"},
		{"reconcile_interval", appBlock("reconcile_interval 0"), "bad reconcile_interval value '0': must be positive"},
		{"reservation_timeout", appBlock("reservation_timeout x"), "bad reservation_timeout value 'x'"},
		{"drain_timeout", appBlock("drain_timeout 0"), "bad drain_timeout value '0': must be positive"},
		{"order_window negative", appBlock("order_window -1"), "bad order_window value '-1': must be at least 0"},
		{"order_window bad", appBlock("order_window wide"), "bad order_window value 'wide': not an integer"},
		{"reclaim_hold negative", appBlock("reclaim_hold -1s"), "bad reclaim_hold value '-1s': must be positive"},
		{"reclaim_hold bad", appBlock("reclaim_hold soon"), "bad reclaim_hold value 'soon'"},
		{"fixed_ownership argument", appBlock("fixed_ownership on"), "wrong argument count"},

		{"transport argument", ":8080 {\n\treverse_proxy 127.0.0.1:9000 {\n\t\ttransport orbit_pool extra\n\t}\n}\n", "wrong argument count"},
		{"transport unknown", transportBlock("bogus"), "unrecognized orbit_pool transport option 'bogus'"},
		{"dial_timeout", transportBlock("dial_timeout x"), "bad dial_timeout value 'x'"},
		{"dial_timeout missing", transportBlock("dial_timeout"), "wrong argument count"},
		{"response_header_timeout", transportBlock("response_header_timeout 0"), "bad response_header_timeout value '0': must be positive"},
		{"expect_continue_timeout", transportBlock("expect_continue_timeout -1s"), "bad expect_continue_timeout value '-1s': must be positive"},
		{"max_response_header", transportBlock("max_response_header big"), "bad max_response_header value 'big'"},
		{"max_response_header zero", transportBlock("max_response_header 0"), "bad max_response_header value '0': must be positive"},
		{"transport max_conns_per_host", transportBlock("max_conns_per_host 0"), "bad max_conns_per_host value '0': must be at least 1"},
		{"transport max_dialing_per_host", transportBlock("max_dialing_per_host -2"), "bad max_dialing_per_host value '-2': must be at least 1"},
		{"transport wait_timeout", transportBlock("wait_timeout 1s 2s"), "wrong argument count"},
		{"timeout zero", transportBlock("timeout 0"), "bad timeout value '0': must be positive"},
		{"timeout bad", transportBlock("timeout soon"), "bad timeout value 'soon'"},
		{"timeout extra", transportBlock("timeout 1s 2s"), "wrong argument count"},
		{"deadline_header missing", transportBlock("deadline_header"), "wrong argument count"},
		{"deadline_header bad name", transportBlock("deadline_header Request:Timeout"), "bad deadline_header value 'Request:Timeout': not a header name"},
		{"keepalive", transportBlock("keepalive sometimes"), "bad keepalive value 'sometimes': want off or a positive duration"},
		{"keepalive missing", transportBlock("keepalive"), "wrong argument count"},
		{"keepalive_interval", transportBlock("keepalive_interval often"), "bad keepalive_interval value 'often'"},
		{"keepalive_max_lifetime", transportBlock("keepalive_max_lifetime 0"), "bad keepalive_max_lifetime value '0': must be positive"},
		{"keepalive_max_requests", transportBlock("keepalive_max_requests 0"), "bad keepalive_max_requests value '0': must be at least 1"},
		{"versions", transportBlock("versions 1.1 2.0"), `unsupported HTTP version "2.0" (supported: 1.1, 2, h2c)`},
		{"http3", transportBlock("versions 3"), `unsupported HTTP version "3": the orbit_pool transport does not speak HTTP/3`},
		{"versions missing", transportBlock("versions"), "wrong argument count"},
		{"tls argument", transportBlock("tls yes"), "wrong argument count"},
		{"tls_client_auth", transportBlock("tls_client_auth a b c"), "wrong argument count"},
		{"tls_insecure_skip_verify", transportBlock("tls_insecure_skip_verify yes"), "wrong argument count"},
		{"relay_unreplayable argument", transportBlock("relay_unreplayable yes"), "wrong argument count"},
		{"tls_curves", transportBlock("tls_curves"), "wrong argument count"},
		{"tls_timeout", transportBlock("tls_timeout x"), "bad tls_timeout value 'x'"},
		{"tls_trust_pool missing", transportBlock("tls_trust_pool"), "wrong argument count"},
		{"tls_trust_pool unknown", transportBlock("tls_trust_pool bogus"), "tls.ca_pool.source.bogus"},
		{"tls_trust_pool twice", transportBlock("tls_trust_pool file /a.pem\n\t\t\ttls_trust_pool file /b.pem"), "cannot specify tls_trust_pool twice"},
		{"tls_server_name", transportBlock("tls_server_name"), "wrong argument count"},
		{"tls_renegotiation", transportBlock("tls_renegotiation sometimes"), "bad tls_renegotiation value 'sometimes': want never, once or freely"},
		{"tls_except_ports", transportBlock("tls_except_ports"), "wrong argument count"},
		{"tls to http upstream", ":8080 {\n\treverse_proxy http://127.0.0.1:9000 {\n\t\ttransport orbit_pool {\n\t\t\ttls\n\t\t}\n\t}\n}\n", "upstream address scheme is HTTP but transport is configured for HTTP+TLS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(tc.caddyfile), nil)
			if err == nil {
				t.Fatalf("adapting succeeded; want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// validateJSON runs a config through caddy.Validate, as `caddy validate`
// does: load, provision and validate every module, start nothing.
func validateJSON(t *testing.T, config string) error {
	t.Helper()
	var cfg caddy.Config
	if err := json.Unmarshal([]byte(config), &cfg); err != nil {
		t.Fatalf("decoding config: %v", err)
	}
	return caddy.Validate(&cfg)
}

func appConfig(app string) string {
	return `{"apps": {"orbit_pool": ` + app + `}}`
}

func transportConfig(transport string) string {
	return `{"apps": {"http": {"servers": {"s": {"listen": [":0"], "routes": [{"handle": [
		{"handler": "reverse_proxy", "upstreams": [{"dial": "127.0.0.1:9000"}],
		 "transport": ` + transport + `}]}]}}}}}`
}

// TestValidateErrors checks the message of every setting the app and the
// transport reject once provisioned.
func TestValidateErrors(t *testing.T) {
	for _, tc := range []struct {
		name, config, want string
	}{
		{"segment relative", appConfig(`{"segment": "orbit"}`), `segment must be an absolute path, got "orbit"`},
		{"socket_dir relative", appConfig(`{"socket_dir": "run/orbit"}`), `socket_dir must be an absolute path, got "run/orbit"`},
		{"processes high", appConfig(`{"processes": 257}`), "processes must be between 1 and 256, got 257"},
		{"processes negative", appConfig(`{"processes": -1}`), "processes must be between 1 and 256, got -1"},
		{"keys", appConfig(`{"keys": -1}`), "keys must be at least 1, got -1"},
		{"keys high", appConfig(`{"keys": 2000000}`), "table sizes: orbitpool: keys 2000000 out of range"},
		{"conns_per_process", appConfig(`{"conns_per_process": -3}`), "conns_per_process must be between 1 and"},
		{"policy", appConfig(`{"policy": "random"}`), `unknown policy "random": want local_first or local_only`},
		{"max_conns_per_host", appConfig(`{"max_conns_per_host": -1}`), "max_conns_per_host must not be negative, got -1"},
		{"local_only with a cap", appConfig(`{"policy": "local_only", "max_conns_per_host": 16}`), "max_conns_per_host 16 cannot be shared under policy local_only"},
		{"max_dialing_per_host", appConfig(`{"max_dialing_per_host": -1}`), "max_dialing_per_host must not be negative, got -1"},
		{"wait_timeout", appConfig(`{"wait_timeout": -1}`), "wait_timeout must be positive, got -1ns"},
		{"deadline_near_window negative", appConfig(`{"deadline_near_window": "-1s"}`), "deadline_near_window must not be negative, got -1s"},
		{"max_in_flight", appConfig(`{"max_in_flight": -1}`), "max_in_flight must not be negative, got -1"},
		{"workers", appConfig(`{"workers": -1}`), "workers must not be negative, got -1"},
		{"admission_ceiling", appConfig(`{"admission_ceiling": -1}`), "admission_ceiling must not be negative, got -1"},
		{"reconcile_interval", appConfig(`{"reconcile_interval": "-1s"}`), "reconcile_interval must be positive, got -1s"},
		{"reservation_timeout", appConfig(`{"reservation_timeout": "-1s"}`), "reservation_timeout must be positive, got -1s"},
		{"drain_timeout", appConfig(`{"drain_timeout": "-1s"}`), "drain_timeout must be positive, got -1s"},
		{"order_window negative", appConfig(`{"order_window": -1}`), "order_window must be between 0 and 2147483647, got -1"},
		{"order_window high", appConfig(`{"order_window": 4294967296}`), "order_window must be between 0 and 2147483647, got 4294967296"},
		{"reclaim_hold", appConfig(`{"reclaim_hold": "-1s"}`), "reclaim_hold must not be negative, got -1s"},

		{"versions", transportConfig(`{"protocol": "orbit_pool", "versions": ["1.1", "3"]}`), `unsupported HTTP version "3": the orbit_pool transport does not speak HTTP/3`},
		{"dial_timeout", transportConfig(`{"protocol": "orbit_pool", "dial_timeout": "-1s"}`), "dial_timeout must be positive, got -1s"},
		{"response_header_timeout", transportConfig(`{"protocol": "orbit_pool", "response_header_timeout": "-1s"}`), "response_header_timeout must not be negative, got -1s"},
		{"expect_continue_timeout", transportConfig(`{"protocol": "orbit_pool", "expect_continue_timeout": "-1s"}`), "expect_continue_timeout must not be negative, got -1s"},
		{"max_response_header_size", transportConfig(`{"protocol": "orbit_pool", "max_response_header_size": -1}`), "max_response_header must not be negative, got -1"},
		{"transport max_conns_per_host", transportConfig(`{"protocol": "orbit_pool", "max_conns_per_host": -1}`), "max_conns_per_host must not be negative, got -1"},
		{"transport cap under local_only", `{"apps": {"orbit_pool": {"policy": "local_only"}, "http": {"servers": {"s": {"listen": [":0"], "routes": [{"handle": [
			{"handler": "reverse_proxy", "upstreams": [{"dial": "127.0.0.1:9000"}], "transport": {"protocol": "orbit_pool", "max_conns_per_host": 8}}]}]}}}}}`,
			"max_conns_per_host 8 cannot be shared under policy local_only"},
		{"unix upstream", `{"apps": {"http": {"servers": {"s": {"listen": [":0"], "routes": [{"handle": [
			{"handler": "reverse_proxy", "upstreams": [{"dial": "127.0.0.1:9000"}, {"dial": "unix//run/app.sock"}], "transport": {"protocol": "orbit_pool"}}]}]}}}}}`,
			`upstream "unix//run/app.sock": the orbit_pool transport dials TCP upstreams only; use the http transport for a unix upstream`},
		{"transport max_dialing_per_host", transportConfig(`{"protocol": "orbit_pool", "max_dialing_per_host": -1}`), "max_dialing_per_host must not be negative, got -1"},
		{"transport wait_timeout", transportConfig(`{"protocol": "orbit_pool", "wait_timeout": "-1s"}`), "wait_timeout must be positive, got -1s"},
		{"transport timeout", transportConfig(`{"protocol": "orbit_pool", "timeout": "-1s"}`), "timeout must not be negative, got -1s"},
		{"deadline header", transportConfig(`{"protocol": "orbit_pool", "deadline_headers": ["Request Timeout"]}`), `deadline header "Request Timeout" is not a valid header name`},
		{"idle_timeout", transportConfig(`{"protocol": "orbit_pool", "keep_alive": {"idle_timeout": "-1s"}}`), "keepalive idle timeout must be positive, got -1s"},
		{"max_lifetime", transportConfig(`{"protocol": "orbit_pool", "keep_alive": {"max_lifetime": "-1s"}}`), "keepalive_max_lifetime must not be negative, got -1s"},
		{"max_requests", transportConfig(`{"protocol": "orbit_pool", "keep_alive": {"max_requests": -1}}`), "keepalive_max_requests must not be negative, got -1"},
		{"tls server name placeholder", transportConfig(`{"protocol": "orbit_pool", "tls": {"server_name": "{http.request.host}"}}`), `tls_server_name "{http.request.host}": placeholders are not supported by the orbit_pool transport`},
		{"tls client cert", transportConfig(`{"protocol": "orbit_pool", "tls": {"client_certificate_file": "/nonexistent/c.pem", "client_certificate_key_file": "/nonexistent/k.pem"}}`), "making TLS client config: loading client certificate key pair"},
		{"transport app invalid", `{"apps": {"orbit_pool": {"policy": "random"}, "http": {"servers": {"s": {"listen": [":0"], "routes": [{"handle": [
			{"handler": "reverse_proxy", "upstreams": [{"dial": "127.0.0.1:9000"}], "transport": {"protocol": "orbit_pool"}}]}]}}}}}`,
			`unknown policy "random"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateJSON(t, tc.config)
			if err == nil {
				t.Fatalf("validation succeeded; want an error containing %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %q does not contain %q", err, tc.want)
			}
		})
	}
}

// TestPolicyAndCapValidate: local_only without a cap, and a cap under
// local_first, are valid; only the two together are refused (see
// TestValidateErrors).
func TestPolicyAndCapValidate(t *testing.T) {
	for _, app := range []string{`{"policy": "local_only"}`, `{"max_conns_per_host": 16}`, `{"policy": "local_first", "max_conns_per_host": 16}`} {
		if err := validateJSON(t, appConfig(app)); err != nil {
			t.Errorf("%s: %v", app, err)
		}
	}
}

// TestValidateDefaults checks that the app with no settings and a transport
// with none are valid, and what the defaults come to.
func TestValidateDefaults(t *testing.T) {
	if err := validateJSON(t, appConfig(`{}`)); err != nil {
		t.Fatalf("empty app: %v", err)
	}
	if err := validateJSON(t, transportConfig(`{"protocol": "orbit_pool"}`)); err != nil {
		t.Fatalf("transport without an app: %v", err)
	}
	a := new(App)
	a.setDefaults()
	if err := a.Validate(); err != nil {
		t.Fatal(err)
	}
	if a.Segment != "/dev/shm/orbit-pool" || a.SocketDir != "/dev/shm/orbit-pool.sock" {
		t.Errorf("segment %q, socket dir %q", a.Segment, a.SocketDir)
	}
	if a.Processes != 64 || a.Keys != 1024 || a.ConnsPerProcess != 1024 || a.Policy != PolicyLocalFirst {
		t.Errorf("table %d/%d/%d, policy %q", a.Processes, a.Keys, a.ConnsPerProcess, a.Policy)
	}
	if *a.MaxInFlight != 16384 || a.Workers != 16384 || a.MemoryLimit == 0 || a.AdmissionCeiling != 32768 {
		t.Errorf("max_in_flight %d, workers %d, memory %d, admission_ceiling %d", *a.MaxInFlight, a.Workers, a.MemoryLimit, a.AdmissionCeiling)
	}
	if cfg := a.fleetConfig(); *a.OrderWindow != 64 || cfg.OrderWindow != 64 {
		t.Errorf("order_window %d, given to the pool as %d; want 64", *a.OrderWindow, cfg.OrderWindow)
	}
	strict := App{OrderWindow: new(0)}
	strict.setDefaults()
	if cfg := strict.fleetConfig(); cfg.OrderWindow != 0 || cfg.usageKey() == a.fleetConfig().usageKey() {
		t.Errorf("order_window 0 is given to the pool as %d, or opens the same membership as the default", cfg.OrderWindow)
	}
	if cfg := a.fleetConfig(); cfg.ReclaimHold != time.Second {
		t.Errorf("reclaim_hold given to the pool as %s; want 1s", cfg.ReclaimHold)
	}
	none := App{ReclaimHold: new(caddy.Duration(0))}
	none.setDefaults()
	if cfg := none.fleetConfig(); cfg.ReclaimHold != 0 || cfg.usageKey() == a.fleetConfig().usageKey() {
		t.Errorf("reclaim_hold 0 is given to the pool as %s, or opens the same membership as the default", cfg.ReclaimHold)
	}
	if cfg := a.fleetConfig(); cfg.FixedOwnership {
		t.Error("fixed_ownership is on by default")
	}
	fixed := App{FixedOwnership: true}
	fixed.setDefaults()
	if cfg := fixed.fleetConfig(); !cfg.FixedOwnership || cfg.usageKey() == a.fleetConfig().usageKey() {
		t.Error("fixed_ownership is not given to the node, or opens the same membership as the default")
	}
	// Stop and Cleanup without a Start (or after a failed Provision) are
	// harmless.
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	defer cancel()
	dir := t.TempDir()
	p := &App{Segment: filepath.Join(dir, "seg"), SocketDir: filepath.Join(dir, "sock")}
	if err := p.Provision(ctx); err != nil {
		t.Fatal(err)
	}
	if err := p.Stop(); err != nil {
		t.Error(err)
	}
	if err := p.Cleanup(); err != nil {
		t.Error(err)
	}
	if err := new(App).Cleanup(); err != nil {
		t.Error(err)
	}
}

// TestDrainTimeoutFollowsStartedConfig: the membership drains siblings'
// exchanges for the drain_timeout of the config that last started with it;
// a config that takes it over sets its own only once it starts, so that a
// refused reload leaves the running config's.
func TestDrainTimeoutFollowsStartedConfig(t *testing.T) {
	ctx, cancel := caddy.NewContext(caddy.Context{Context: t.Context()})
	defer cancel()
	dir := t.TempDir()
	app := func(drain time.Duration) *App {
		a := &App{Segment: filepath.Join(dir, "seg"), SocketDir: filepath.Join(dir, "sock"), DrainTimeout: caddy.Duration(drain)}
		if err := a.Provision(ctx); err != nil {
			t.Fatal(err)
		}
		return a
	}
	def := app(0)
	if err := def.Start(); err != nil {
		t.Fatal(err)
	}
	defer def.Cleanup()
	f := def.currentFleet()
	if got := time.Duration(f.drain.Load()); got != DefaultDrainTimeout {
		t.Fatalf("drain after the first config started: %s, want the default %s", got, DefaultDrainTimeout)
	}
	next := app(time.Minute)
	if _, err := next.fleet(false); err != nil {
		t.Fatal(err)
	}
	defer next.Cleanup()
	if next.currentFleet() != f {
		t.Fatal("a config of the same fleet settings opened another membership")
	}
	if got := time.Duration(f.drain.Load()); got != DefaultDrainTimeout {
		t.Errorf("drain once a new config took the membership, before it started: %s, want the running config's %s", got, DefaultDrainTimeout)
	}
	if err := next.Start(); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(f.drain.Load()); got != time.Minute {
		t.Errorf("drain after the new config started: %s, want its drain_timeout 1m0s", got)
	}
	// A config refused after its apps started (another app's Start
	// failed) is cleaned up while the running one goes on: the drain is
	// the running config's again.
	if err := next.Cleanup(); err != nil {
		t.Fatal(err)
	}
	if got := time.Duration(f.drain.Load()); got != DefaultDrainTimeout {
		t.Errorf("drain after the started config was cleaned up: %s, want the running config's %s", got, DefaultDrainTimeout)
	}
}
