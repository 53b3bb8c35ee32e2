package sqlstore

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sirupsen/logrus"
)

// Token revocation across the daemons sharing a PostgreSQL database.
//
// Each daemon caches token lookups (see userCache), and a revocation must
// take effect on every daemon before the call that revoked returns: a
// logout, a device deletion, a password change or a deactivation is
// answered only once no daemon accepts the old tokens any more.
//
// The revoking daemon therefore waits for the others to confirm. Its
// notification (on the tokens channel, sent at commit) carries a revocation ID
// that names the server; each daemon of that server that hears it drops
// the user's tokens and answers on the acks channel ("<revocation ID> <instance ID>") with the ID and its own
// instance ID. The daemons to wait for are those whose notification
// connections are open: each listener connects with application_name
// "keyserver-listener <server> <instance ID>" (<server> a hash of the
// server name and schema, so that other servers and schemas using the same
// database are not waited for), which pg_stat_activity lists; a connection ends with its
// process (kill -9 included), so a dead daemon is never waited for. A
// daemon that does not confirm within revocationConfirmTimeout (its
// listener stalled, or it connected just after the commit and never heard
// it) has its listener connection terminated: its caches go off, once it
// notices, and come back empty when it has reconnected. A revoking daemon
// whose own listener is down cannot hear confirmations and terminates the
// others' listeners at once. Those two fallbacks leave a window (until
// the other daemon notices its connection ended) that only a stalled or
// disconnected listener opens; the timeout is logged as a warning.
//
// The alternative, checking a revocation counter in the database before
// trusting a cache entry, costs a round trip on every authenticated
// request, which is what the cache exists to save; confirmations cost a
// round trip per daemon on revocations only, which are rare. A token check
// stays a map lookup.

const (
	// listenerAppName prefixes the application_name of the listeners'
	// connections; the instance ID follows.
	listenerAppName = "keyserver-listener "
)

// revocationConfirmTimeout bounds the wait for the other daemons'
// confirmations of a revocation.
var revocationConfirmTimeout = 2 * time.Second

// revocations tracks this daemon's revocations awaiting confirmation.
type revocations struct {
	// server is a hash of the server name, which sets apart the daemons
	// of one server from those of others using the same database; id
	// names this daemon among them.
	server string
	id     string
	seq    atomic.Uint64
	mu     sync.Mutex
	// waits: revocation ID -> the confirmations heard so far.
	waits map[string]*revocationWait
	log   atomic.Pointer[logrus.FieldLogger]
}

type revocationWait struct {
	started time.Time
	acked   map[string]bool
	heard   chan struct{} // a confirmation arrived (capacity 1)
}

func newRevocations(serverName string) *revocations {
	var b [8]byte
	_, _ = rand.Read(b[:])
	r := &revocations{server: revocationServer(serverName, ""), id: hex.EncodeToString(b[:]), waits: map[string]*revocationWait{}}
	var l logrus.FieldLogger = logrus.StandardLogger()
	r.log.Store(&l)
	return r
}

// start registers a new revocation before its notification is sent, so
// that no confirmation is missed, and returns its ID:
// "<server>.<instance>.<sequence>".
func (r *revocations) start() (string, *revocationWait) {
	id := r.server + "." + r.id + "." + strconv.FormatUint(r.seq.Add(1), 10)
	w := &revocationWait{started: time.Now(), acked: map[string]bool{}, heard: make(chan struct{}, 1)}
	r.mu.Lock()
	defer r.mu.Unlock()
	// Revocations whose transaction rolled back are never waited for;
	// they are forgotten here.
	for k, old := range r.waits {
		if time.Since(old.started) > time.Minute {
			delete(r.waits, k)
		}
	}
	r.waits[id] = w
	return id, w
}

func (r *revocations) end(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.waits, id)
}

// acked records a confirmation heard on the acks channel.
func (r *revocations) acked(payload string) {
	revID, instance, ok := strings.Cut(payload, " ")
	if !ok {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	w := r.waits[revID]
	if w == nil {
		return
	}
	w.acked[instance] = true
	select {
	case w.heard <- struct{}{}:
	default:
	}
}

// missing returns the instances of want that have not confirmed.
func (r *revocations) missing(w *revocationWait, want []string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for _, i := range want {
		if !w.acked[i] {
			out = append(out, i)
		}
	}
	return out
}

// SetLogger sets where the store logs what it cannot report as an error
// (a daemon that did not confirm a revocation).
func (s *Store) SetLogger(l logrus.FieldLogger) { s.rev.log.Store(&l) }

// revocationServer names the daemons that wait for each other's
// confirmations: those of one server name in one schema. The daemons of
// another schema (which have channels of their own, see notifyChannels)
// never hear this schema's revocations, and are not waited for.
func revocationServer(serverName, schema string) string {
	key := serverName
	if schema != "" && schema != "public" {
		key += "\x00" + schema
	}
	h := sha256.Sum256([]byte(key))
	return hex.EncodeToString(h[:4])
}

// listenerURI is uri with the application_name that names this daemon's
// listener in pg_stat_activity.
func (s *Store) listenerURI() string {
	u, err := url.Parse(s.uri)
	if err != nil {
		return s.uri
	}
	q := u.Query()
	q.Set("application_name", s.listenerName(s.rev.id))
	u.RawQuery = q.Encode()
	return u.String()
}

// listenerName is the application_name of the listener of instance id of
// this server.
func (s *Store) listenerName(id string) string {
	return listenerAppName + s.rev.server + " " + id
}

// tokensPayload is the payload of a token notification: the user, and the
// revocation ID to confirm.
func tokensPayload(userID, revID string) string { return userID + "\n" + revID }

// heardRevocation handles a token notification: the user's cached tokens
// are dropped, then the revocation is confirmed.
func (s *Store) heardRevocation(payload string) {
	userID, revID, _ := strings.Cut(payload, "\n")
	s.tokens.revoke(userID)
	if !strings.HasPrefix(revID, s.rev.server+".") || strings.HasPrefix(revID, s.rev.server+"."+s.rev.id+".") {
		// Another server's (which does not wait for this daemon), or
		// this daemon's own (dropped at commit already).
		return
	}
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), revocationConfirmTimeout)
		defer cancel()
		if _, err := s.db.ExecContext(ctx, `SELECT pg_notify($1, $2)`, s.channels.acks, revID+" "+s.rev.id); err != nil {
			(*s.rev.log.Load()).WithError(err).Warn("could not confirm a token revocation")
		}
	}()
}

// confirmRevocation waits, after the commit of revocation revID, until
// every other daemon listening on the database has confirmed it (see the
// comment at the top of this file).
func (s *Store) confirmRevocation(revID string, w *revocationWait) {
	defer s.rev.end(revID)
	log := (*s.rev.log.Load()).WithField("revocation", revID)
	ctx, cancel := context.WithTimeout(context.Background(), revocationConfirmTimeout)
	defer cancel()
	others, err := s.listeners(ctx)
	if err != nil {
		log.WithError(err).Warn("could not list the daemons sharing the database to confirm a token revocation")
		return
	}
	if len(others) == 0 {
		return
	}
	if _, listening := s.tokens.generation(); !listening {
		// This daemon hears no confirmations: the others' caches are
		// restarted instead.
		s.terminateListeners(log, others)
		return
	}
	for {
		missing := s.rev.missing(w, others)
		if len(missing) == 0 {
			return
		}
		select {
		case <-w.heard:
		case <-ctx.Done():
			log.WithField("instances", missing).Warn("daemons did not confirm a token revocation; their caches are restarted")
			s.terminateListeners(log, missing)
			return
		}
	}
}

// listeners returns the instance IDs of the other daemons whose listeners
// are connected to the database.
func (s *Store) listeners(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT application_name FROM pg_stat_activity
		WHERE datname = current_database() AND application_name LIKE $1`, s.listenerName("%"))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var name string
		if err := rows.Scan(&name); err != nil {
			return nil, err
		}
		if id := strings.TrimPrefix(name, s.listenerName("")); id != s.rev.id {
			out = append(out, id)
		}
	}
	return out, rows.Err()
}

// terminateListeners ends the listener connections of the given
// instances, whose caches then go off until they listen again.
func (s *Store) terminateListeners(log logrus.FieldLogger, instances []string) {
	ctx, cancel := context.WithTimeout(context.Background(), revocationConfirmTimeout)
	defer cancel()
	for _, id := range instances {
		if _, err := s.db.ExecContext(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
			WHERE datname = current_database() AND application_name = $1`, s.listenerName(id)); err != nil {
			log.WithError(err).WithField("instance", id).Error("could not restart the caches of a daemon that did not confirm a token revocation")
		}
	}
}

// Listening reports whether the store's caches are on: always on SQLite,
// on PostgreSQL while WatchStream hears the other daemons' changes.
func (s *Store) Listening() bool {
	_, on := s.tokens.generation()
	return on
}
