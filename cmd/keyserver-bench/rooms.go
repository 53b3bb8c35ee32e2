package main

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
)

// The room phases: room-create (a user creates a public room),
// room-join (a user joins a random room of a pool) and room-send (a
// member of a pool room sends a message to it). The pool is one public
// room per client, made before the first room phase.

type roomPool struct {
	mu      sync.Mutex
	rooms   []string
	members map[string][]*device // room -> devices of users joined to it
	txn     atomic.Int64
}

func usesRooms(phases string) bool {
	for _, p := range strings.Split(phases, ",") {
		if strings.HasPrefix(p, "room-") {
			return true
		}
	}
	return false
}

// setupRooms creates the pool, each room by a different user.
func (b *bench) setupRooms(ctx context.Context) error {
	b.pool = &roomPool{members: map[string][]*device{}}
	for i := 0; i < b.o.clients; i++ {
		d := b.devices[(i*b.o.devices)%len(b.devices)]
		id, err := b.createRoom(ctx, b.o.urls[i%len(b.o.urls)], d)
		if err != nil {
			return fmt.Errorf("room set-up: %w", err)
		}
		b.pool.rooms = append(b.pool.rooms, id)
		b.pool.members[id] = []*device{d}
	}
	return nil
}

// publicRoom is the body of the tool's /createRoom requests.
var publicRoom = map[string]any{"preset": "public_chat"}

func (b *bench) createRoom(ctx context.Context, base string, d *device) (string, error) {
	var r struct {
		RoomID string `json:"room_id"`
	}
	err := b.do(ctx, base, "POST", "/_matrix/client/v3/createRoom", d.token, publicRoom, &r)
	return r.RoomID, err
}

func (b *bench) roomCreate(ctx context.Context, c *client) error {
	return c.send(ctx, "POST", "/_matrix/client/v3/createRoom", b.devices[c.rng.IntN(len(b.devices))].token, publicRoom, nil)
}

func (b *bench) roomJoin(ctx context.Context, c *client) error {
	rng := c.rng
	d := b.devices[rng.IntN(len(b.devices))]
	room := b.pool.rooms[rng.IntN(len(b.pool.rooms))]
	if err := c.send(ctx, "POST", "/_matrix/client/v3/rooms/"+url.PathEscape(room)+"/join", d.token, map[string]any{}, nil); err != nil {
		return err
	}
	b.pool.mu.Lock()
	b.pool.members[room] = append(b.pool.members[room], d)
	b.pool.mu.Unlock()
	return nil
}

func (b *bench) roomSend(ctx context.Context, c *client) error {
	rng := c.rng
	room := b.pool.rooms[rng.IntN(len(b.pool.rooms))]
	b.pool.mu.Lock()
	members := b.pool.members[room]
	d := members[rng.IntN(len(members))]
	b.pool.mu.Unlock()
	txn := fmt.Sprintf("bench%d", b.pool.txn.Add(1))
	return c.send(ctx, "PUT", "/_matrix/client/v3/rooms/"+url.PathEscape(room)+"/send/m.room.message/"+txn, d.token,
		map[string]any{"msgtype": "m.text", "body": "hello " + txn}, nil)
}
