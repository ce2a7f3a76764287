package proxy

import (
	"crypto/tls"
	"net/http"
	"testing"
)

func TestKeyFor(t *testing.T) {
	if KeyFor("http", "127.0.0.1:80", nil, "") != KeyFor("HTTP", "127.0.0.1:80", nil, "") {
		t.Error("scheme case changes the key")
	}
	distinct := [][2][4]any{
		{{"http", "h:80", (*tls.Config)(nil), ""}, {"http", "h:81", (*tls.Config)(nil), ""}},
		{{"http", "h:443", (*tls.Config)(nil), ""}, {"https", "h:443", (*tls.Config)(nil), ""}},
		{{"https", "h:443", (*tls.Config)(nil), ""}, {"https", "h:443", (*tls.Config)(nil), "tls:x"}},
		{{"https", "h:443", (*tls.Config)(nil), ""}, {"https", "h:443", &tls.Config{ServerName: "other"}, ""}},
		{{"https", "h:443", (*tls.Config)(nil), ""}, {"https", "h:443", &tls.Config{InsecureSkipVerify: true}, ""}},
		{{"https", "h:443", (*tls.Config)(nil), ""}, {"https", "h:443", &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{{1}}}}}, ""}},
	}
	for _, d := range distinct {
		a, b := d[0], d[1]
		ka := KeyFor(a[0].(string), a[1].(string), a[2].(*tls.Config), a[3].(string))
		kb := KeyFor(b[0].(string), b[1].(string), b[2].(*tls.Config), b[3].(string))
		if ka == kb {
			t.Errorf("%v and %v share a key", a, b)
		}
	}
	// The Transport files requests under the same key.
	tr := &Transport{KeyExtra: "x"}
	req, err := http.NewRequest("GET", "http://127.0.0.1:8080/", nil)
	if err != nil {
		t.Fatal(err)
	}
	e, err := tr.upstream(req)
	if err != nil {
		t.Fatal(err)
	}
	if e.key != KeyFor("http", "127.0.0.1:8080", nil, "x") {
		t.Error("Transport's key differs from KeyFor's")
	}
	if len(e.key.String()) != 32 {
		t.Errorf("key string %q", e.key.String())
	}
}
