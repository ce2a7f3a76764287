package proxy

import (
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"
)

// adv75cTrickle is a request body of n chunks of size bytes, each after a
// pause: a slow but live client upload.
type adv75cTrickle struct {
	n, size int
	pause   time.Duration
	sent    int
}

func (b *adv75cTrickle) Read(p []byte) (int, error) {
	if b.sent >= b.n {
		return 0, io.EOF
	}
	time.Sleep(b.pause)
	k := min(len(p), b.size)
	for i := range p[:k] {
		p[i] = 'a' + byte(b.sent%26)
	}
	b.sent++
	return k, nil
}

func (b *adv75cTrickle) want() string {
	var sb strings.Builder
	for i := range b.n {
		sb.WriteString(strings.Repeat(string(rune('a'+i%26)), b.size))
	}
	return sb.String()
}

// adv75cPair is remotePair (one connection per key) with the client's warn
// logs observed and its idle streams to a sibling capped at maxIdle (0:
// default).
func adv75cPair(t *testing.T, maxIdle int) (owner, client *member, logs *observer.ObservedLogs) {
	t.Helper()
	spec := testSpec
	spec.Path = filepath.Join(t.TempDir(), "seg")
	conf := func(tr *Transport) { tr.MaxConnsPerKey = 1 }
	owner = newMember(t, spec, conf)
	core, logs := observer.New(zapcore.WarnLevel)
	client = newMemberOpts(t, spec, NodeOptions{SweepInterval: 50 * time.Millisecond, Logger: zap.New(core), MaxIdlePeerStreams: maxIdle}, conf)
	return owner, client, logs
}

// adv75cDo sends one request and returns the body read whole.
func adv75cDo(t *testing.T, m *member, method, url string, body io.Reader, timeout time.Duration) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, url, body)
	if body != nil {
		req.ContentLength = -1
		req.GetBody = nil
	}
	resp, err := m.tr.RoundTrip(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}
