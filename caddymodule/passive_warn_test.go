package caddymodule

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPassiveHealthChecksAreWarned: a reverse_proxy whose passive health
// checks count failures, with the orbit_pool transport, is warned as it
// loads that they count orbit_pool's refusals as the upstream's failures;
// one without is not.
func TestPassiveHealthChecksAreWarned(t *testing.T) {
	for _, tc := range []struct {
		name, health string
		warned       bool
	}{
		{"passive", `, "health_checks": {"passive": {"fail_duration": "10s"}}`, true},
		{"passive without fail_duration", `, "health_checks": {"passive": {"unhealthy_status": [503]}}`, false},
		{"none", ``, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log := filepath.Join(t.TempDir(), "log")
			err := validateJSON(t, `{"logging": {"logs": {"default": {"writer": {"output": "file", "filename": "`+log+`"}}}},
				"apps": {"http": {"servers": {"s": {"listen": [":0"], "routes": [{"handle": [
				{"handler": "reverse_proxy", "upstreams": [{"dial": "127.0.0.1:9000"}], "transport": {"protocol": "orbit_pool"}`+tc.health+`}]}]}}}}}`)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := os.ReadFile(log)
			if got := strings.Contains(string(b), "passive health checks count every error of a transport"); got != tc.warned {
				t.Errorf("warned %v, want %v; log:\n%s", got, tc.warned, b)
			}
		})
	}
}
