package sqlstore

import (
	"context"
	"errors"
	"sort"
	"sync"

	"github.com/keyserver/keyserver/storage"
)

// claimQueue combines concurrent ClaimKeys calls into one transaction
// (group commit). A claim's cost is mostly its commit: on SQLite the
// writer is one at a time anyway, and on durable PostgreSQL each commit
// waits for the log to reach the disk. So a call that finds the maximum
// number of groups already running waits in the queue, and when a group
// ends, the first waiting call leads the next group: it takes every
// waiting call (up to maxGroupRequests requests) and runs them in one
// transaction. A call that finds the queue empty and a group slot free
// runs at once, alone, exactly as a claim did before groups.
//
// Each call gets exactly the keys of its own requests. A group whose
// transaction fails is not answered with that failure: its calls are run
// again one by one, each in its own transaction, so that a call whose
// request makes the database fail (or a failure of the moment) gets its
// own answer, and the others theirs. Nothing of the failed transaction was
// kept, so no key is handed out twice.
type claimQueue struct {
	mu      sync.Mutex
	waiting []*claimCall
	running int // groups being run
	max     int // groups run at once
	// groups counts the groups of more than one call (for tests).
	groups int
	// beforeGroup, when set, is called by a leader before it takes its
	// group from the queue (for tests, to hold calls in the queue).
	beforeGroup func()
}

// maxGroupRequests bounds the requests of one group, so that one
// transaction holds the writer for a bounded time.
const maxGroupRequests = 256

type claimState int

const (
	claimQueued  claimState = iota
	claimLeading            // to take and run the next group
	claimTaken              // in a group being run
	claimDone               // out and err are set
)

// claimCall is one ClaimKeys call.
type claimCall struct {
	ctx   context.Context
	reqs  []storage.ClaimRequest
	out   []storage.ClaimedKey
	err   error
	state claimState    // guarded by claimQueue.mu
	wake  chan struct{} // a send when state becomes claimLeading or claimDone
}

// signal wakes the call to look at its state: a wake still pending will
// do as well.
func (c *claimCall) signal() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// do runs reqs as one call, combined with others, with run running a group.
func (q *claimQueue) do(ctx context.Context, reqs []storage.ClaimRequest, run func([]*claimCall)) ([]storage.ClaimedKey, error) {
	c := &claimCall{ctx: ctx, reqs: reqs, wake: make(chan struct{}, 1)}
	q.mu.Lock()
	q.waiting = append(q.waiting, c)
	if q.running < q.max {
		q.running++
		c.state = claimLeading
	}
	q.mu.Unlock()
	done := ctx.Done()
	for {
		q.mu.Lock()
		st := c.state
		q.mu.Unlock()
		switch st {
		case claimDone:
			return c.out, c.err
		case claimLeading:
			q.lead(run)
			continue // the leader's call is in its group: done
		}
		select {
		case <-c.wake:
		case <-done:
			// A call still queued leaves; one in a group stays to the end
			// of the group, which is short.
			q.mu.Lock()
			if c.state == claimQueued {
				q.remove(c)
				q.mu.Unlock()
				return nil, ctx.Err()
			}
			q.mu.Unlock()
			done = nil
		}
	}
}

// remove takes c out of the queue; q.mu is held.
func (q *claimQueue) remove(c *claimCall) {
	for i, w := range q.waiting {
		if w == c {
			q.waiting = append(q.waiting[:i], q.waiting[i+1:]...)
			return
		}
	}
}

// lead takes the waiting calls as a group, runs it, and hands the lead to
// the first call that came meanwhile (or frees the group's slot).
func (q *claimQueue) lead(run func([]*claimCall)) {
	if q.beforeGroup != nil {
		q.beforeGroup()
	}
	q.mu.Lock()
	n, reqs := 0, 0
	for n < len(q.waiting) && (n == 0 || reqs+len(q.waiting[n].reqs) <= maxGroupRequests) {
		reqs += len(q.waiting[n].reqs)
		n++
	}
	group := append([]*claimCall(nil), q.waiting[:n]...)
	q.waiting = append(q.waiting[:0], q.waiting[n:]...)
	for _, c := range group {
		c.state = claimTaken
	}
	if len(group) > 1 {
		q.groups++
	}
	q.mu.Unlock()
	defer func() {
		// Even if run panicked, every call of the group is answered and
		// the queue moves on; the panic goes on in the leader.
		p := recover()
		q.mu.Lock()
		for _, c := range group {
			if p != nil {
				c.out, c.err = nil, errors.New("a claim of the same group failed")
			}
			c.state = claimDone
			c.signal()
		}
		if len(q.waiting) > 0 {
			next := q.waiting[0]
			next.state = claimLeading
			next.signal()
		} else {
			q.running--
		}
		q.mu.Unlock()
		if p != nil {
			panic(p)
		}
	}()
	run(group)
}

// claimGroup runs a group of ClaimKeys calls. A group of one call runs as
// a call always did; a larger one runs in one transaction, its requests
// in one order (user, device, algorithm, then the order the calls came in)
// so that concurrent groups lock count rows in the same order.
func (s *Store) claimGroup(group []*claimCall) {
	live := group[:0:0]
	for _, c := range group {
		if err := c.ctx.Err(); err != nil {
			c.err = err
			continue
		}
		live = append(live, c)
	}
	if len(live) == 1 {
		live[0].out, live[0].err = s.claimAlone(live[0].ctx, live[0].reqs)
		return
	}
	if len(live) == 0 {
		return
	}
	type item struct{ call, req int }
	var items []item
	for i, c := range live {
		for j := range c.reqs {
			items = append(items, item{i, j})
		}
	}
	sort.SliceStable(items, func(a, b int) bool {
		x, y := live[items[a].call].reqs[items[a].req], live[items[b].call].reqs[items[b].req]
		if x.UserID != y.UserID {
			return x.UserID < y.UserID
		}
		if x.DeviceID != y.DeviceID {
			return x.DeviceID < y.DeviceID
		}
		return x.Algorithm < y.Algorithm
	})
	// Keys by call and request, so that each call's keys come in the
	// order of its requests, as they do alone.
	claimed := make([][]storage.ClaimedKey, len(live))
	found := make([][]bool, len(live))
	// No one call's end may cancel the others' transaction.
	ctx := context.WithoutCancel(live[0].ctx)
	err := s.write(ctx, func(tx *txn) error {
		for i, c := range live {
			claimed[i] = make([]storage.ClaimedKey, len(c.reqs))
			found[i] = make([]bool, len(c.reqs))
		}
		for _, it := range items {
			k, ok, err := s.claimKey(ctx, tx, live[it.call].reqs[it.req])
			if err != nil {
				return err
			}
			claimed[it.call][it.req], found[it.call][it.req] = k, ok
		}
		return nil
	})
	if err != nil {
		for _, c := range live {
			c.out, c.err = s.claimAlone(c.ctx, c.reqs)
		}
		return
	}
	for i, c := range live {
		c.out = make([]storage.ClaimedKey, 0, len(c.reqs))
		for j, k := range claimed[i] {
			if found[i][j] {
				c.out = append(c.out, k)
			}
		}
	}
}

// claimGroups is how many claim groups run at once: one on SQLite, whose
// writer is one at a time anyway, so that the calls arriving meanwhile
// wait for the next group; a few on PostgreSQL, whose commits of different
// connections go to the disk together.
func claimGroups(d dialect) int {
	if d.name == "sqlite3" {
		return 1
	}
	return 2
}
