package proxy

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestAdv46OverLimitHeadCutMidNameIsTooLarge: a sibling's request head past
// the 2x that readPeerHead reads (3 MB of fields with long names, against
// 1 MB + 4 KiB). The read stops mid-line, and bufio returns that last
// partial line without the limit's error: textproto sees a field line cut
// in its name ("missing colon") and the owner refuses the head as
// malformed, not as over its limit. The caller's own reader treats a used
// up limit as too large whatever the parse made of the cut (exchange.go);
// the owner's reader does not look at lr.n. TestPaddedRequestHeadHeldToItsOwnSize
// expects ErrRequestHeaderTooLarge for an over-limit head.
func TestAdv46OverLimitHeadCutMidNameIsTooLarge(t *testing.T) {
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer up.Close()
	owner, client := remotePair(t, func(tr *Transport) { tr.MaxResponseHeaderBytes = 64 << 10 })
	warm(t, owner, up.URL+"/warm")

	long := strings.Repeat("n", 2000)
	req, _ := http.NewRequest("GET", up.URL+"/over", nil)
	for i := 0; i < 1500; i++ { // 3 MB, each line's colon at its end
		req.Header[fmt.Sprintf("X-%s-%04d", long, i)] = []string{"v"}
	}
	resp, err := client.tr.RoundTrip(req)
	if resp != nil {
		resp.Body.Close()
	}
	if !errors.Is(err, ErrRequestHeaderTooLarge) {
		t.Errorf("a 3 MB head through the sibling: %v; want ErrRequestHeaderTooLarge", err)
	}
	if n := client.node.Stats().ReusedRemote; n == 0 {
		t.Errorf("the sibling's request did not go through the owner (%+v)", client.node.Stats())
	}
}
