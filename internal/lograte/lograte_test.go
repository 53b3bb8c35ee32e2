package lograte

import (
	"errors"
	"testing"
	"time"

	"github.com/sirupsen/logrus"
	logtest "github.com/sirupsen/logrus/hooks/test"
)

// One line per interval and kind; the next line counts those left out.
func TestWarnOncePerIntervalAndKind(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	l := New(time.Minute, func() time.Time { return now })
	log, hook := logtest.NewNullLogger()
	boom := errors.New("database is locked")
	for i := 0; i < 5; i++ {
		l.Warn(log, boom, "reading the queue")
	}
	l.Warn(log, boom, "renewing a lease") // another kind: not held back
	if n := len(hook.AllEntries()); n != 2 {
		t.Fatalf("%d lines, want 2", n)
	}
	first := hook.AllEntries()[0]
	if first.Level != logrus.WarnLevel || first.Message != "reading the queue" || first.Data[logrus.ErrorKey] != boom {
		t.Fatalf("first line %v %q %v", first.Level, first.Message, first.Data)
	}
	if _, ok := first.Data["suppressed"]; ok {
		t.Fatal("the first line claims suppressed lines")
	}

	now = now.Add(59 * time.Second)
	l.Warn(log, boom, "reading the queue")
	if n := len(hook.AllEntries()); n != 2 {
		t.Fatalf("a line within the interval was written (%d lines)", n)
	}
	now = now.Add(time.Second)
	l.Warn(log, boom, "reading the queue")
	last := hook.LastEntry()
	if len(hook.AllEntries()) != 3 || last.Message != "reading the queue" || last.Data["suppressed"] != 5 {
		t.Fatalf("after the interval: %d lines, last %q %v", len(hook.AllEntries()), last.Message, last.Data)
	}
	// The count starts again.
	now = now.Add(time.Minute)
	l.Warn(log, boom, "reading the queue")
	if _, ok := hook.LastEntry().Data["suppressed"]; ok || len(hook.AllEntries()) != 4 {
		t.Fatalf("count not reset: %v", hook.LastEntry().Data)
	}
}
