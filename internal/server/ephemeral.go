package server

import (
	"time"

	"github.com/sirupsen/logrus"

	"github.com/keyserver/keyserver/config"
	"github.com/keyserver/keyserver/internal/clock"
	"github.com/keyserver/keyserver/receipts"
	"github.com/keyserver/keyserver/storage/sqlstore"
	"github.com/keyserver/keyserver/typing"
)

// newEphemeral builds typing and receipts, which write the stream (ch)
// and queue EDUs for other servers; receipts reset the unread counts of
// unread.
func newEphemeral(cfg *config.Config, store *sqlstore.Store, ch changes, unread receipts.Unread, federated bool,
	log logrus.FieldLogger, now func() time.Time) (*typing.Service, *receipts.Service) {
	var clk clock.Clock = clock.Real{}
	if now != nil {
		clk = nowClock{now}
	}
	t := typing.New(store, typing.Options{ServerName: cfg.ServerName, Federated: federated,
		Changed: ch.StreamAdvanced, Queued: ch.OutboundQueued, Logger: log, Clock: clk})
	r := receipts.New(store, receipts.Options{ServerName: cfg.ServerName, Federated: federated, Unread: unread,
		Changed: ch.StreamAdvanced, Queued: ch.OutboundQueued, Logger: log, Now: now})
	return t, r
}

// nowClock is a clock reading the time from a function, waiting in real
// time.
type nowClock struct{ now func() time.Time }

func (c nowClock) Now() time.Time                         { return c.now() }
func (c nowClock) After(d time.Duration) <-chan time.Time { return time.After(d) }
