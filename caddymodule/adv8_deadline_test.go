package caddymodule

import (
	"fmt"
	"net/http"
	"testing"
)

// TestAdv8DeadlineHeaderValues: a deadline header value that does not
// parse is ignored (the request goes upstream as without it); one that
// gives a deadline already passed is refused with 504 before anything
// reaches the upstream; of several values the earliest counts; a huge one
// saturates instead of wrapping into the past.
func TestAdv8DeadlineHeaderValues(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprint(w, "ok")
	}), false)
	port := freePort(t)
	startCaddy(t, "", site(port, up.hostport(), "deadline_header Request-Timeout grpc-timeout", ""))
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)

	for _, tc := range []struct {
		name   string
		values map[string][]string
		status int
	}{
		{"negative", map[string][]string{"Request-Timeout": {"-1"}}, 200},
		{"nan", map[string][]string{"Request-Timeout": {"NaN"}}, 200},
		{"inf", map[string][]string{"Request-Timeout": {"Inf"}}, 200},
		{"exponent", map[string][]string{"Request-Timeout": {"1e-9"}}, 200},
		{"hex", map[string][]string{"Request-Timeout": {"0x0"}}, 200},
		{"go duration", map[string][]string{"Request-Timeout": {"1ns"}}, 200},
		{"grpc negative", map[string][]string{"Grpc-Timeout": {"-1S"}}, 200},
		{"grpc nine digits", map[string][]string{"Grpc-Timeout": {"000000000S"}}, 200},
		{"empty", map[string][]string{"Request-Timeout": {""}}, 200},
		{"huge seconds", map[string][]string{"Request-Timeout": {"999999999999.999999999"}}, 200},
		{"huge grpc", map[string][]string{"Grpc-Timeout": {"99999999H"}}, 200},
		{"zero", map[string][]string{"Request-Timeout": {"0"}}, 504},
		{"grpc zero", map[string][]string{"Grpc-Timeout": {"0n"}}, 504},
		{"earliest of two lines", map[string][]string{"Request-Timeout": {"100", "0"}}, 504},
		{"earliest of two headers", map[string][]string{"Request-Timeout": {"100"}, "Grpc-Timeout": {"0m"}}, 504},
		{"bad then zero", map[string][]string{"Request-Timeout": {"junk", "0.0"}}, 504},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := up.requests.Load()
			resp, body, _ := timedGet(t, url, http.Header(tc.values))
			if resp.StatusCode != tc.status {
				t.Fatalf("%v: status %d %q, want %d", tc.values, resp.StatusCode, body, tc.status)
			}
			reached := up.requests.Load() - before
			if want := int64(0); tc.status == 200 {
				want = 1
				if reached != want {
					t.Fatalf("%v: upstream got %d requests, want %d", tc.values, reached, want)
				}
			} else if reached != want {
				t.Fatalf("%v: a refused request reached the upstream", tc.values)
			}
		})
	}
}
