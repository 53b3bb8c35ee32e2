package sqlstore_test

import (
	"context"
	"slices"
	"strconv"
	"testing"

	"github.com/keyserver/keyserver/internal/testutil"
	"github.com/keyserver/keyserver/storage"
)

// A local user's join starts tracking the room's remote members (joined
// or invited, not those who left) and fetches nothing: only a list cached
// while they shared no room here is marked stale. Their leave stops
// tracking those who then share no room with a local user, and only them:
// what was cached of them is dropped. A remote user's own moves start and
// stop their tracking the same way.
func TestMembershipStartsAndStopsTrackingRemoteMembers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		set := func(room, user, membership string) []string {
			t.Helper()
			res, err := s.SetMembership(ctx, room, user, membership, 1)
			if err != nil {
				t.Fatalf("%s %s %s: %v", user, membership, room, err)
			}
			var stale []string
			for _, u := range res.NewlyStale {
				stale = append(stale, u.UserID)
			}
			slices.Sort(stale)
			return stale
		}
		const l1, l2, r1, r2, r3, r4 = "@l1:x", "@l2:x", "@r1:a.example", "@r2:b.example", "@r3:c.example", "@r4:d.example"
		all := []string{r1, r2, r3, r4}
		tracked := func() []string {
			t.Helper()
			var out []string
			for _, u := range all {
				shares, err := s.SharesRoomWithLocal(ctx, u)
				if err != nil {
					t.Fatal(err)
				}
				if shares {
					out = append(out, u)
				}
			}
			return out
		}
		state := func() (cached, stale []string) {
			t.Helper()
			lists, err := s.RemoteDeviceLists(ctx, all)
			if err != nil {
				t.Fatal(err)
			}
			for _, u := range all {
				if lists[u] != nil {
					cached = append(cached, u)
				}
				if _, ok, err := s.StaleEntry(ctx, u); err != nil {
					t.Fatal(err)
				} else if ok {
					stale = append(stale, u)
				}
			}
			return cached, stale
		}
		expect := func(what string, got []string, want ...string) {
			t.Helper()
			if !slices.Equal(got, want) {
				t.Fatalf("%s: %v, want %v", what, got, want)
			}
		}

		// r2 shares !other with l2: tracked, nothing to fetch yet.
		set("!other:x", l2, storage.MembershipJoin)
		expect("r2 joins l2's room", set("!other:x", r2, storage.MembershipJoin))
		// Remote users alone in a room are not tracked.
		set("!big:x", r1, storage.MembershipJoin)
		set("!big:x", r2, storage.MembershipJoin)
		set("!big:x", r3, storage.MembershipInvite)
		set("!big:x", r4, storage.MembershipJoin)
		expect("r4 leaves before any local user joins", set("!big:x", r4, storage.MembershipLeave))
		expect("tracked before l1 joins", tracked(), r2)
		// r1 and r3 were queried meanwhile: their lists are cached, but
		// nobody keeps them up to date.
		for _, u := range []string{r1, r3} {
			if _, err := s.ReplaceRemoteDeviceList(ctx, storage.RemoteDeviceList{UserID: u, StreamID: 1, FetchedTS: 1,
				Devices: []storage.RemoteDevice{{DeviceID: "D", KeyJSON: []byte(`{"device_id":"D"}`)}}}, u[4:]); err != nil {
				t.Fatal(err)
			}
		}

		expect("l1 joins: the lists cached untracked are stale", set("!big:x", l1, storage.MembershipJoin), r1, r3)
		expect("tracked after l1 joins", tracked(), r1, r2, r3)
		cached, stale := state()
		expect("cached after l1 joins", cached, r1, r3)
		expect("stale after l1 joins", stale, r1, r3)

		expect("l1 leaves", set("!big:x", l1, storage.MembershipLeave))
		expect("tracked after l1 leaves: r2 still shares a room with l2", tracked(), r2)
		cached, stale = state()
		expect("cached after l1 leaves", cached)
		expect("stale after l1 leaves", stale)

		// A remote user's own join to a room with a local user, and leave.
		expect("r4 joins l2's room", set("!other:x", r4, storage.MembershipJoin))
		expect("tracked with r4", tracked(), r2, r4)
		expect("r4 leaves l2's room", set("!other:x", r4, storage.MembershipLeave))
		expect("tracked at the end", tracked(), r2)
	})
}

// A local user's join or leave costs as many statements in a room of 30
// remote members as in a room of 3: the remote members' tracking is
// worked out by one query, not one per member.
func TestLocalMoveStatementsDoNotGrowWithRemoteMembers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		set := func(room, user, membership string) {
			t.Helper()
			if _, err := s.SetMembership(ctx, room, user, membership, 1); err != nil {
				t.Fatalf("%s %s %s: %v", user, membership, room, err)
			}
		}
		set("!other:x", "@l2:x", storage.MembershipJoin)
		for i := range 30 {
			u := "@r" + string(rune('a'+i%26)) + string(rune('0'+i/26)) + ":remote" + string(rune('a'+i%26)) + ".example"
			set("!other:x", u, storage.MembershipJoin) // tracked: shares !other with l2
			if i < 3 {
				set("!small:x", u, storage.MembershipJoin)
			}
			set("!large:x", u, storage.MembershipJoin)
		}
		cost := func(room, membership string) int64 {
			before := s.StatementsSent()
			set(room, "@l1:x", membership)
			return s.StatementsSent() - before
		}
		if small, large := cost("!small:x", storage.MembershipJoin), cost("!large:x", storage.MembershipJoin); small != large {
			t.Errorf("a join cost %d statements with 3 remote members, %d with 30", small, large)
		}
		if small, large := cost("!small:x", storage.MembershipLeave), cost("!large:x", storage.MembershipLeave); small != large {
			t.Errorf("a leave cost %d statements with 3 remote members, %d with 30", small, large)
		}
	})
}

// Joining a room over federation stores its state at once: beyond one
// statement per event stored, the statements do not grow with the room's
// members, and no remote member's list is marked to be fetched (it is
// fetched when a client needs it).
func TestIngestedMembersCostNoStatementEach(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		ingest := func(roomID string, members int) int64 {
			t.Helper()
			empty, me := "", "@me:x"
			ev := func(id, evType string, stateKey *string, membership string) storage.RoomEvent {
				return storage.RoomEvent{EventID: id, RoomID: roomID, Type: evType, StateKey: stateKey, Sender: "@c:remote.example",
					Depth: 2, RoomVersion: "10", JSON: []byte(`{"content":{"membership":"` + membership + `"}}`), Membership: membership}
			}
			events := []storage.RoomEvent{ev("$create"+roomID, "m.room.create", &empty, "")}
			for i := range members {
				u := "@" + roomID[1:6] + strconv.Itoa(i) + ":s" + strconv.Itoa(i%7) + "." + roomID[1:6] + ".example" // each room's own users and servers
				events = append(events, ev("$m"+strconv.Itoa(i)+roomID, "m.room.member", &u, "join"))
			}
			events = append(events, ev("$me"+roomID, "m.room.member", &me, "join"))
			ids := eventIDs(events)
			before := s.StatementsSent()
			res, err := s.IngestRoomEvents(ctx, storage.RoomIngest{RoomID: roomID, Create: &storage.Room{RoomVersion: "10", Creator: "@c:remote.example"},
				Outliers: events, PutState: ids, Now: 1})
			if err != nil {
				t.Fatal(err)
			}
			if len(res.NewlyStale) != 0 {
				t.Fatalf("%d of %d remote members marked to be fetched", len(res.NewlyStale), members)
			}
			return s.StatementsSent() - before
		}
		small, large := ingest("!small:remote.example", 10), ingest("!large:remote.example", 60)
		if large-small != 50 {
			t.Errorf("ingesting 10 members took %d statements, 60 took %d: %d more for 50 more events", small, large, large-small)
		}
	})
}

// A remote user's list cached while nobody here shared a room with them
// (fetched for a query) was not kept up to date by their server: when a
// room becomes shared, by their join or a local user's, they are marked
// stale. A user already sharing another room is not.
func TestSharingStartsTrackingOfListCachedUntracked(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		const l1, r1, r2, r3 = "@l1:x", "@r1:a.example", "@r2:a.example", "@r3:a.example"
		for _, u := range []string{r1, r2, r3} {
			if _, err := s.ReplaceRemoteDeviceList(ctx, storage.RemoteDeviceList{UserID: u, StreamID: 1, FetchedTS: 1,
				Devices: []storage.RemoteDevice{{DeviceID: "D", KeyJSON: []byte(`{"device_id":"D"}`)}}}, "a.example"); err != nil {
				t.Fatal(err)
			}
		}
		stale := func(u string) bool {
			t.Helper()
			_, ok, err := s.StaleEntry(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			return ok
		}
		newly := func(res storage.MembershipResult, err error) []string {
			t.Helper()
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, u := range res.NewlyStale {
				out = append(out, u.UserID)
			}
			slices.Sort(out)
			return out
		}
		// r1 joins a room with l1 in it.
		newly(s.SetMembership(ctx, "!a:x", l1, storage.MembershipJoin, 1))
		if got := newly(s.SetMembership(ctx, "!a:x", r1, storage.MembershipJoin, 1)); !slices.Equal(got, []string{r1}) || !stale(r1) {
			t.Fatalf("r1's join: newly stale %v", got)
		}
		// l1 joins a room with r2 and r1 in it: r2 starts, r1 shared already.
		newly(s.SetMembership(ctx, "!b:x", r2, storage.MembershipJoin, 1))
		newly(s.SetMembership(ctx, "!b:x", r1, storage.MembershipJoin, 1))
		if got := newly(s.SetMembership(ctx, "!b:x", l1, storage.MembershipJoin, 1)); !slices.Equal(got, []string{r2}) || !stale(r2) {
			t.Fatalf("l1's join: newly stale %v", got)
		}
		// r3 shares nothing: not marked.
		if stale(r3) {
			t.Fatal("r3 marked stale")
		}
	})
}

// A local user's join is announced to the servers of the room that did
// not share a room with them: each of their devices is queued for each
// such server, with its keys, and nothing for a server that shares
// another room with them already, nor for a join that shares nothing new.
func TestLocalJoinAnnouncesDevicesToNewServers(t *testing.T) {
	testutil.ForEachDatabase(t, func(t *testing.T, db testutil.Database) {
		ctx := context.Background()
		s := open(t, db)
		const l, quiet = "@l:x", "@quiet:x"
		if _, err := s.CreateAccount(ctx, l, "h", &storage.NewLogin{UserID: l, DeviceID: "D1", TokenHash: "t1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Login(ctx, storage.NewLogin{UserID: l, DeviceID: "D2", TokenHash: "t2"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.UploadKeys(ctx, l, "D1", nil, func(storage.KeyState) (storage.KeyWrite, error) {
			return storage.KeyWrite{DeviceKeys: []byte(`{"user_id":"@l:x","device_id":"D1"}`)}, nil
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.CreateAccount(ctx, quiet, "h", nil); err != nil {
			t.Fatal(err)
		}
		set := func(room, user, membership string) storage.MembershipResult {
			t.Helper()
			res, err := s.SetMembership(ctx, room, user, membership, 1)
			if err != nil {
				t.Fatalf("%s %s %s: %v", user, membership, room, err)
			}
			return res
		}
		pending := func(dest string) []string {
			t.Helper()
			var out []string
			for _, u := range mustPending(t, s, dest) {
				if u.UserID == l && u.DeviceID == "D1" && string(u.KeyJSON) != `{"user_id":"@l:x","device_id":"D1"}` {
					t.Errorf("D1 queued for %s with keys %s", dest, u.KeyJSON)
				}
				out = append(out, u.UserID+"/"+u.DeviceID)
			}
			slices.Sort(out)
			return out
		}
		// a.example shares !old with l already.
		set("!old:x", "@ra:a.example", storage.MembershipJoin)
		if res := set("!old:x", l, storage.MembershipJoin); !res.DeviceUpdatesQueued {
			t.Fatal("l's first join announced nothing")
		}
		if got := pending("a.example"); !slices.Equal(got, []string{l + "/D1", l + "/D2"}) {
			t.Fatalf("queued for a.example after joining !old: %v", got)
		}
		if err := s.MarkUpdatesSent(ctx, "a.example", mustPending(t, s, "a.example")); err != nil {
			t.Fatal(err)
		}

		for _, u := range []string{"@ra2:a.example", "@rb:b.example", "@rc:c.example", "@rc2:c.example"} {
			set("!new:x", u, storage.MembershipJoin)
		}
		set("!new:x", "@rd:d.example", storage.MembershipInvite)
		set("!new:x", "@re:e.example", storage.MembershipJoin)
		set("!new:x", "@re:e.example", storage.MembershipLeave)
		if res := set("!new:x", l, storage.MembershipJoin); !res.DeviceUpdatesQueued {
			t.Fatal("l's join of !new announced nothing")
		}
		for _, dest := range []string{"b.example", "c.example", "d.example"} {
			if got := pending(dest); !slices.Equal(got, []string{l + "/D1", l + "/D2"}) {
				t.Errorf("queued for %s: %v", dest, got)
			}
		}
		for _, dest := range []string{"a.example", "e.example"} {
			if got := pending(dest); len(got) != 0 {
				t.Errorf("queued for %s, which receives l's updates already or left: %v", dest, got)
			}
		}
		// A user without devices announces nothing; a join that shares no
		// new server announces nothing either.
		if res := set("!new:x", quiet, storage.MembershipJoin); res.DeviceUpdatesQueued {
			t.Error("a user without devices was announced")
		}
		if res := set("!old:x", quiet, storage.MembershipJoin); res.DeviceUpdatesQueued {
			t.Error("a user without devices was announced")
		}
	})
}
