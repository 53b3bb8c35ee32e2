package keyserver

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"

	"github.com/keyserver/keyserver/internal/reqlog"
)

// A timeout of any shape is read without error; only a non-negative
// integer counts, the rest is logged at debug and the default used.
func TestRemoteTimeoutShapes(t *testing.T) {
	log, hook := logtest.NewNullLogger()
	log.SetLevel(logrus.DebugLevel)
	ctx := reqlog.With(context.Background(), log)
	s := &Service{}
	for _, c := range []struct {
		body, query string
		want        time.Duration
		logged      bool
	}{
		{`{}`, "", defaultRemoteTimeout, false},
		{`{"timeout":null}`, "", defaultRemoteTimeout, false},
		{`{"timeout":0}`, "", defaultRemoteTimeout, false},
		{`{"timeout":2500}`, "", 2500 * time.Millisecond, false},
		{`{"timeout":600000}`, "", maxRemoteTimeout, false},
		{`{"timeout":9223372036854775807}`, "", maxRemoteTimeout, false},
		{`{"timeout":{"secs":10,"nanos":0}}`, "", defaultRemoteTimeout, true},
		{`{"timeout":"2500"}`, "", defaultRemoteTimeout, true},
		{`{"timeout":-1}`, "", defaultRemoteTimeout, true},
		{`{"timeout":2.5}`, "", defaultRemoteTimeout, true},
		{`{"timeout":1e3}`, "", defaultRemoteTimeout, true},
		{`{"timeout":99999999999999999999}`, "", defaultRemoteTimeout, true},
		{`{}`, "2500", 2500 * time.Millisecond, false},
		{`{"timeout":{"secs":1}}`, "2500", 2500 * time.Millisecond, true},
		{`{"timeout":700}`, "2500", 700 * time.Millisecond, false},
		{`{}`, "soon", defaultRemoteTimeout, true},
		{`{"timeout":true}`, "-5", defaultRemoteTimeout, true},
	} {
		hook.Reset()
		var req QueryRequest
		if err := json.Unmarshal([]byte(c.body), &req); err != nil {
			t.Fatalf("%s: %v", c.body, err)
		}
		got := s.remoteTimeout(ctx, req.Timeout.Or(ParseTimeout(c.query)))
		if got != c.want {
			t.Errorf("%s ?timeout=%s: %v, want %v", c.body, c.query, got, c.want)
		}
		logged := false
		for _, e := range hook.AllEntries() {
			logged = logged || e.Level == logrus.DebugLevel
		}
		if logged != c.logged {
			t.Errorf("%s ?timeout=%s: logged %v, want %v", c.body, c.query, logged, c.logged)
		}
	}
}
