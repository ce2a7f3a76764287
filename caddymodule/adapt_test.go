package caddymodule

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/caddyserver/caddy/v2/caddyconfig"
	_ "github.com/caddyserver/caddy/v2/caddyconfig/caddyfile"
	"github.com/caddyserver/caddy/v2/caddytest"
)

var update = flag.Bool("update", false, "rewrite the expected JSON of the Caddyfile adapt tests")

const adaptSeparator = "\n----------\n"

// TestCaddyfileAdapt adapts each testdata/caddyfile_adapt/*.caddyfiletest
// (a Caddyfile, a line of dashes, the JSON it must adapt to) and compares.
func TestCaddyfileAdapt(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "caddyfile_adapt", "*.caddyfiletest"))
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no adapt tests found")
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".caddyfiletest"), func(t *testing.T) {
			data, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			input, expected, _ := strings.Cut(string(data), adaptSeparator)
			if *update {
				out, _, err := caddyconfig.GetAdapter("caddyfile").Adapt([]byte(input), nil)
				if err != nil {
					t.Fatalf("adapting: %v", err)
				}
				var pretty bytes.Buffer
				if err := json.Indent(&pretty, out, "", "\t"); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(file, []byte(input+adaptSeparator+pretty.String()+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
				return
			}
			if !caddytest.CompareAdapt(t, file, input, "caddyfile", strings.TrimSpace(expected)) {
				t.Errorf("%s: adapted config differs from the expected one (above)", file)
			}
		})
	}
}
