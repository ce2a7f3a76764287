package proxy

import (
	"context"
	"net/http"
	"reflect"
	"testing"
)

// TestAdv44UserAgentAnySpellingH2LikeNetHTTP: x/net/http2 takes a request
// header key that is any spelling of user-agent ("user-agent", as a
// caller that fills the map itself, or copies HTTP/2 field names, has it)
// as the User-Agent: it sends that value and no default. So does the
// owner's own exchange. Through a sibling, flagNoUserAgent is set from the
// canonical key alone; the head on the unix leg then carries HTTP/1.1's
// default and the caller's value, both read back as User-Agent, and the
// owner, told the request had none, deletes both: the upstream gets
// "Go-http-client/2.0" and never the caller's value.
func TestAdv44UserAgentAnySpellingH2LikeNetHTTP(t *testing.T) {
	url, seen := h2cRecorder(t)
	owner, client := h2Pair(t, url)
	outs := eachH2Path(owner, client, func(ctx context.Context) *http.Request {
		req, _ := http.NewRequestWithContext(ctx, "GET", url+"/ua", nil)
		req.Header = http.Header{"user-agent": {"my-agent/1"}}
		return req
	})
	for name, o := range outs {
		if o.err != "" || o.status != 200 {
			t.Fatalf("%s: %+v", name, o)
		}
	}
	hs := seen()
	if len(hs) != 3 {
		t.Fatalf("upstream saw %d requests; want 3", len(hs))
	}
	if got := hs[0]["User-Agent"]; !reflect.DeepEqual(got, []string{"my-agent/1"}) {
		t.Fatalf("x/net sent User-Agent %q; the reference itself changed", got)
	}
	for i, name := range h2Paths[1:] {
		if got, want := hs[i+1]["User-Agent"], hs[0]["User-Agent"]; !reflect.DeepEqual(got, want) {
			t.Errorf("%s: upstream got User-Agent %q; net/http's HTTP/2 client sends %q", name, got, want)
		}
	}
	if n := client.node.Stats().ReusedRemote; n == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", client.node.Stats())
	}
}
