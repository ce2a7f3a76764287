package caddymodule

import (
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
)

// TestAdv8ConfigOutOfRange: values the modules cannot honour as written
// are refused, while adapting or validating, with an error naming the
// option, never taken silently as something else.
func TestAdv8ConfigOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		name, caddyfile, json, want string
	}{
		{"max_response_header overflow", transportBlock("max_response_header 9EiB"), "", "max_response_header"},
		{"workers beyond the governor", appBlock("workers 2000000"), "", "workers"},
		{"workers beyond the governor json", "", appConfig(`{"workers": 2000000}`), "workers"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var err error
			if tc.caddyfile != "" {
				var out []byte
				out, _, err = caddyconfig.GetAdapter("caddyfile").Adapt([]byte(tc.caddyfile), nil)
				if err == nil {
					err = validateJSON(t, string(out))
				}
			} else {
				err = validateJSON(t, tc.json)
			}
			if err == nil {
				t.Fatalf("accepted; want an error naming %q", tc.want)
			}
			if !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "negative") {
				t.Fatalf("error %q: want one naming %q, and not about a negative value", err, tc.want)
			}
		})
	}
}
