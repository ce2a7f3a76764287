package caddymodule

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/caddyserver/caddy/v2/caddytest"
)

// writePEM writes certificates to a PEM file in dir and returns its path.
func writePEM(t *testing.T, dir, name string, ders ...[]byte) string {
	t.Helper()
	var b []byte
	for _, der := range ders {
		b = append(b, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})...)
	}
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// otherCA is the DER of a self-signed CA certificate that signed nothing the
// tests' upstreams present.
func otherCA(t *testing.T) []byte {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "adv10 unrelated CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return der
}

// TestAdv10TrustPoolInKey: two reverse proxies to the same TLS upstream,
// one trusting the CA that signed its certificate (tls_trust_pool file),
// the other a CA that signed nothing of it. The second must not be served
// on a connection the first made and verified: with the stock transport it
// fails verification (502), and so must it here; the upstream never sees
// its request. Likewise a reload that narrows the trusted CAs must not
// leave requests on connections verified under the old ones.
func TestAdv10TrustPoolInKey(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), true)
	dir := t.TempDir()
	good := writePEM(t, dir, "good.pem", up.Certificate().Raw)
	wrong := writePEM(t, dir, "wrong.pem", otherCA(t))
	trusting, distrusting := freePort(t), freePort(t)
	startCaddy(t, "",
		site(trusting, "https://"+up.hostport(), "tls_trust_pool file "+good, "")+
			site(distrusting, "https://"+up.hostport(), "tls_trust_pool file "+wrong, ""))

	resp, body := get(t, fmt.Sprintf("http://127.0.0.1:%d/", trusting))
	if resp.StatusCode != 200 || body != "ok" {
		t.Fatalf("through the proxy that trusts the upstream's CA: %d %q", resp.StatusCode, body)
	}
	before := up.requests.Load()
	resp, body = get(t, fmt.Sprintf("http://127.0.0.1:%d/", distrusting))
	if resp.StatusCode == 200 {
		t.Errorf("through the proxy that trusts another CA: %d %q, served on a connection verified under the first proxy's CAs", resp.StatusCode, body)
	}
	if n := up.requests.Load() - before; n != 0 {
		t.Errorf("the upstream saw %d requests through the proxy that does not trust it", n)
	}
}

// TestAdv10TrustPoolFileRotatedInPlace: the operator replaces the trusted
// CA file's contents (same path) with a CA that did not sign the upstream's
// certificate, and reloads. With the stock transport the new config's
// requests fail verification (502); here too they must not go on the
// connections verified under the file's old contents.
func TestAdv10TrustPoolFileRotatedInPlace(t *testing.T) {
	up := newUpstream(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok")
	}), true)
	dir := t.TempDir()
	ca := writePEM(t, dir, "ca.pem", up.Certificate().Raw)
	seg := segmentPath(t)
	port := freePort(t)
	load := func(generation int) {
		t.Helper()
		cfg := fmt.Sprintf(`{
	admin `+adminAddr+`
	auto_https off
	persist_config off
	grace_period 1s
	orbit_pool {
		segment %s
	}
}
:%d {
	bind 127.0.0.1
	header X-Config %d
	reverse_proxy https://%s {
		transport orbit_pool {
			tls_trust_pool file %s
		}
	}
}
`, seg, port, generation, up.hostport(), ca)
		caddytest.NewTester(t).InitServer(cfg, "caddyfile")
		if t.Failed() {
			t.FailNow()
		}
	}
	url := fmt.Sprintf("http://127.0.0.1:%d/", port)
	load(1)
	for range 2 {
		if resp, body := get(t, url); resp.StatusCode != 200 || body != "ok" {
			t.Fatalf("trusting the upstream's CA: %d %q", resp.StatusCode, body)
		}
	}
	writePEM(t, dir, "ca.pem", otherCA(t))
	load(2)
	before := up.requests.Load()
	// A request the old server took in the instant of the reload may
	// still be its; the ones after are the new config's.
	if resp, err := client.Get(url); err == nil {
		resp.Body.Close()
	}
	for range 2 {
		resp, body := get(t, url)
		if resp.Header.Get("X-Config") != "2" {
			continue
		}
		if resp.StatusCode == 200 {
			t.Fatalf("after the trusted CA file was replaced and the config reloaded: %d %q, on a connection verified under the old CA", resp.StatusCode, body)
		}
	}
	if n := up.requests.Load() - before; n > 1 {
		t.Errorf("the upstream saw %d requests after the reload that distrusts it", n)
	}
}
