package pusher

import (
	"context"
	"encoding/json"
	"math"

	"github.com/keyserver/keyserver/storage"
)

// catchUp evaluates the events up to target that no daemon has evaluated
// yet.
func (s *Service) catchUp(ctx context.Context, target storage.StreamPos) error {
	if storage.StreamPos(s.done.Load()) >= target {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		from, err := s.db.PushCursor(ctx)
		if err != nil {
			return err
		}
		s.seen(from)
		if from >= target {
			return nil
		}
		evs, err := s.db.PushEvents(ctx, from, target, batchSize)
		if err != nil {
			return err
		}
		if len(evs) == 0 {
			// Nothing to record: the cursor stays for the next range that
			// has events (reading an empty range again is cheap), and no
			// write is made for stream positions without room events.
			s.seen(target)
			return nil
		}
		to := target
		if len(evs) == batchSize {
			to = evs[len(evs)-1].Pos
		}
		b := s.evaluate(ctx, evs)
		if b.err != nil {
			return b.err
		}
		claimed, err := s.db.CommitPushes(ctx, from, to, b.notifications, b.reads)
		if err != nil {
			return err
		}
		if claimed { // otherwise another daemon did this range: read the cursor again
			s.seen(to)
			s.deliver(ctx, to, b.pushes)
		}
	}
}

func (s *Service) seen(pos storage.StreamPos) {
	for {
		old := s.done.Load()
		if int64(pos) <= old || s.done.CompareAndSwap(old, int64(pos)) {
			return
		}
	}
}

// push is a notification to deliver to a user's pushers.
type push struct {
	userID  string
	event   storage.PushEvent
	fields  map[string]any // the event's JSON
	outcome Outcome
	// senderName is the sender's display name in the room ("" if none).
	senderName string
}

type batch struct {
	notifications []storage.PushNotification
	reads         []storage.PushRead
	pushes        []push
	err           error
}

// roomFacts are what the rules need of a room, read once per batch.
type roomFacts struct {
	members     map[string]map[string]any // joined user -> member event content
	levels      powerLevels
	memberCount int
}

type powerLevels struct {
	Users         map[string]json.Number `json:"users"`
	UsersDefault  json.Number            `json:"users_default"`
	Notifications map[string]json.Number `json:"notifications"`
	// creators of a room of version 12 are above every level, without
	// being listed in users.
	creators map[string]bool
}

// roomCreators reads the creators of a version 12 room from its create
// event: its sender and content.additional_creators (none in other
// versions).
func roomCreators(create []byte) map[string]bool {
	var ev struct {
		Sender  string `json:"sender"`
		Content struct {
			RoomVersion        string   `json:"room_version"`
			AdditionalCreators []string `json:"additional_creators"`
		} `json:"content"`
	}
	if json.Unmarshal(create, &ev) != nil || ev.Content.RoomVersion != "12" {
		return nil
	}
	out := map[string]bool{ev.Sender: true}
	for _, u := range ev.Content.AdditionalCreators {
		out[u] = true
	}
	return out
}

func (p powerLevels) of(userID string) int {
	if p.creators[userID] {
		return math.MaxInt
	}
	if n, ok := p.Users[userID]; ok {
		v, _ := n.Int64()
		return int(v)
	}
	v, _ := p.UsersDefault.Int64()
	return int(v)
}

func (p powerLevels) notificationLevels() map[string]int {
	out := map[string]int{}
	for k, n := range p.Notifications {
		if v, err := n.Int64(); err == nil {
			out[k] = int(v)
		}
	}
	return out
}

// evaluate decides, for each event, which local users it notifies: those
// joined to its room other than its sender (and the invitee of an
// invite), by their rules. A local user's own event marks the room read
// for them, as Synapse resets the counts on the user's own message.
func (s *Service) evaluate(ctx context.Context, evs []storage.PushEvent) batch {
	var b batch
	rooms := map[string]*roomFacts{}
	rules := map[string]RuleSet{}
	now := s.o.Now().UnixMilli()
	for _, e := range evs {
		var fields map[string]any
		if json.Unmarshal(e.JSON, &fields) != nil {
			continue
		}
		if s.isLocal(e.Sender) {
			b.reads = append(b.reads, storage.PushRead{UserID: e.Sender, RoomID: e.RoomID, Pos: e.Pos})
		}
		room, ok := rooms[e.RoomID]
		if !ok {
			st, err := s.db.PushRoomState(ctx, e.RoomID)
			if err != nil {
				b.err = err
				return b
			}
			room = &roomFacts{members: map[string]map[string]any{}, memberCount: len(st.Members)}
			for user, js := range st.Members {
				var ev struct {
					Content map[string]any `json:"content"`
				}
				_ = json.Unmarshal(js, &ev)
				room.members[user] = ev.Content
			}
			if st.PowerLevels != nil {
				var ev struct {
					Content powerLevels `json:"content"`
				}
				_ = json.Unmarshal(st.PowerLevels, &ev)
				room.levels = ev.Content
			}
			room.levels.creators = roomCreators(st.Create)
			rooms[e.RoomID] = room
		}
		targets := make([]string, 0, len(room.members)+1)
		for user := range room.members {
			if user != e.Sender && s.isLocal(user) {
				targets = append(targets, user)
			}
		}
		if invitee := inviteeOf(fields); invitee != "" && invitee != e.Sender && s.isLocal(invitee) {
			if _, joined := room.members[invitee]; !joined {
				targets = append(targets, invitee)
			}
		}
		var senderName string
		if c := room.members[e.Sender]; c != nil {
			senderName, _ = c["displayname"].(string)
		}
		for _, user := range targets {
			rs, ok := rules[user]
			if !ok {
				var err error
				if rs, err = s.o.Rules.Rules(ctx, user); err != nil {
					b.err = err
					return b
				}
				rules[user] = rs
			}
			var display string
			if c := room.members[user]; c != nil {
				display, _ = c["displayname"].(string)
			}
			out := rs.Evaluate(Event{JSON: fields, UserDisplayName: display,
				MemberCount: room.memberCount, SenderPowerLevel: room.levels.of(e.Sender),
				NotificationLevels: room.levels.notificationLevels()})
			if !out.Notify {
				continue
			}
			b.notifications = append(b.notifications, storage.PushNotification{UserID: user, RoomID: e.RoomID,
				EventID: e.EventID, Pos: e.Pos, Highlight: out.Highlight, TS: now})
			b.pushes = append(b.pushes, push{userID: user, event: e, fields: fields, outcome: out, senderName: senderName})
		}
	}
	return b
}

// inviteeOf is the user an m.room.member invite is for ("" otherwise).
func inviteeOf(fields map[string]any) string {
	if fields["type"] != "m.room.member" {
		return ""
	}
	content, _ := fields["content"].(map[string]any)
	if content["membership"] != "invite" {
		return ""
	}
	key, _ := fields["state_key"].(string)
	return key
}
