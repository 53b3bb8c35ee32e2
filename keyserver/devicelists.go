package keyserver

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/keyserver/keyserver/internal/mxerr"
	"github.com/keyserver/keyserver/roomserver"
	"github.com/keyserver/keyserver/storage"
)

// A stream token is "s<position>". Tokens are opaque to clients; /sync
// hands them out as next_batch and /keys/changes takes them back.
func streamToken(pos storage.StreamPos) string { return "s" + strconv.FormatInt(int64(pos), 10) }

// parseStreamToken reads a token. Anything after an "_" is reserved for
// streams added later and ignored, so tokens of a newer version still parse.
func parseStreamToken(param, tok string) (storage.StreamPos, error) {
	num, _, _ := strings.Cut(tok, "_")
	if !strings.HasPrefix(num, "s") {
		return 0, mxerr.InvalidParam("%s is not a valid stream token", param)
	}
	n, err := strconv.ParseInt(num[1:], 10, 64)
	if err != nil || n < 0 {
		return 0, mxerr.InvalidParam("%s is not a valid stream token", param)
	}
	return storage.StreamPos(n), nil
}

// ChangesResponse is the answer to /keys/changes.
type ChangesResponse struct {
	Changed []string `json:"changed"`
	Left    []string `json:"left"`
}

// KeyChanges answers /keys/changes: whose device lists changed between two
// tokens, among the users the caller shares a room with.
func (s *Service) KeyChanges(ctx context.Context, c Caller, from, to string) (ChangesResponse, error) {
	if from == "" {
		return ChangesResponse{}, mxerr.MissingParam("from is required")
	}
	if to == "" {
		return ChangesResponse{}, mxerr.MissingParam("to is required")
	}
	fromPos, err := parseStreamToken("from", from)
	if err != nil {
		return ChangesResponse{}, err
	}
	toPos, err := parseStreamToken("to", to)
	if err != nil {
		return ChangesResponse{}, err
	}
	// "to" may lie beyond what has happened yet; it is only a bound.
	cur, err := s.db.CurrentPos(ctx)
	if err != nil {
		return ChangesResponse{}, err
	}
	toPos = min(toPos, cur)
	ch, err := s.db.DeviceListChanges(ctx, c.UserID, fromPos, toPos)
	if err != nil {
		return ChangesResponse{}, err
	}
	return ChangesResponse{Changed: ch.Changed, Left: ch.Left}, nil
}

// SyncResponse is the end-to-end part of /sync.
type SyncResponse struct {
	NextBatch                    string           `json:"next_batch"`
	DeviceLists                  *ChangesResponse `json:"device_lists,omitempty"`
	DeviceOneTimeKeysCount       map[string]int   `json:"device_one_time_keys_count"`
	DeviceUnusedFallbackKeyTypes []string         `json:"device_unused_fallback_key_types"`
	// AccountData is present when the service has an account data source.
	AccountData *AccountDataSection `json:"account_data,omitempty"`
	// ToDevice is present when the service keeps to-device messages.
	ToDevice *ToDeviceSection `json:"to_device,omitempty"`
	// Rooms is present when the service has rooms (see syncrooms.go).
	Rooms *roomserver.SyncRooms `json:"rooms,omitempty"`
}

// Sync answers /sync. Without since it returns the current state at once.
// With since it returns the device-list and account data changes after
// it (see accountdata.go), waiting up to timeout for one to happen if
// there is none yet; it also returns early when the caller's own key
// counts change (a key was claimed). It also delivers the device's
// to-device messages (see todevice.go), and ends the wait for them. Waiting is driven by the notifier:
// the database is read again only when something was written.
func (s *Service) Sync(ctx context.Context, c Caller, since string, timeout time.Duration, o SyncOptions) (SyncResponse, error) {
	filter, err := s.syncFilter(ctx, c.UserID, o)
	if err != nil {
		return SyncResponse{}, err
	}
	var sincePos, acked storage.StreamPos
	if since != "" {
		var err error
		if sincePos, err = parseStreamToken("since", since); err != nil {
			return SyncResponse{}, err
		}
		if acked, err = parseToDeviceAck(since); err != nil {
			return SyncResponse{}, err
		}
		// The token says the device got its messages up to acked: they go.
		if acked = min(acked, sincePos); acked > 0 && s.opts.ToDevice != nil {
			if err := s.opts.ToDevice.AckToDevice(ctx, c.UserID, c.DeviceID, acked); err != nil {
				return SyncResponse{}, err
			}
		}
	}
	timeout = min(max(timeout, 0), s.opts.SyncMaxTimeout)
	sub := s.notifier.Subscribe(c.UserID)
	defer sub.Close()
	var timer <-chan time.Time
	if timeout > 0 && since != "" {
		t := time.NewTimer(timeout)
		defer t.Stop()
		timer = t.C
	}

	checked := sincePos // changes up to here were looked at and found empty
	for {
		streamCh := sub.Stream()
		cur, err := s.db.CurrentPos(ctx)
		if err != nil {
			return SyncResponse{}, err
		}
		var lists *ChangesResponse
		news := false // account data changed, or to-device messages wait
		if since != "" {
			if sincePos > cur {
				// A token from the future (another database?): start again
				// from now rather than miss everything until then.
				sincePos, checked = cur, cur
			}
			if cur > checked {
				ch, err := s.db.DeviceListChanges(ctx, c.UserID, checked, cur)
				if err != nil {
					return SyncResponse{}, err
				}
				if len(ch.Changed)+len(ch.Left) > 0 {
					if checked > sincePos {
						// Earlier parts of the range were empty; report the whole range.
						if ch, err = s.db.DeviceListChanges(ctx, c.UserID, sincePos, cur); err != nil {
							return SyncResponse{}, err
						}
					}
					lists = &ChangesResponse{Changed: ch.Changed, Left: ch.Left}
				} else if news, err = s.accountDataNews(ctx, c.UserID, checked, cur); err != nil {
					return SyncResponse{}, err
				} else if !news {
					if news, err = s.roomsNews(ctx, c.UserID, checked, cur); err != nil {
						return SyncResponse{}, err
					}
				}
				checked = cur
			}
		}
		if lists == nil && !news && timer != nil {
			if news, err = s.toDeviceNews(ctx, c, acked, cur); err != nil {
				return SyncResponse{}, err
			}
		}
		respond := func(lists *ChangesResponse) (SyncResponse, error) {
			res, err := s.syncResponse(ctx, c, sincePos, acked, cur, lists)
			if err == nil {
				res.Rooms, err = s.roomsSection(ctx, c.UserID, sincePos, cur, o, filter)
			}
			return res, err
		}
		if lists != nil || news || timer == nil {
			return respond(lists)
		}
		select {
		case <-streamCh:
			continue
		case <-sub.User():
			return respond(nil)
		case <-timer:
			return respond(nil)
		case <-sub.Closing():
			return respond(nil)
		case <-ctx.Done():
			return SyncResponse{}, ctx.Err()
		}
	}
}

// syncResponse answers with the changes in (from, pos]; from 0 (no since):
// the whole state; and the device's to-device messages after acked.
func (s *Service) syncResponse(ctx context.Context, c Caller, from, acked, pos storage.StreamPos, lists *ChangesResponse) (SyncResponse, error) {
	counts, unused, err := s.db.KeyCounts(ctx, c.UserID, c.DeviceID)
	if err != nil {
		return SyncResponse{}, err
	}
	accountData, err := s.accountDataSection(ctx, c.UserID, from, pos)
	if err != nil {
		return SyncResponse{}, err
	}
	toDevice, delivered, err := s.toDeviceSection(ctx, c, acked, pos)
	if err != nil {
		return SyncResponse{}, err
	}
	if lists == nil {
		lists = &ChangesResponse{Changed: []string{}, Left: []string{}}
	}
	return SyncResponse{
		NextBatch:                    s.syncToken(pos, delivered),
		ToDevice:                     toDevice,
		DeviceLists:                  lists,
		DeviceOneTimeKeysCount:       withSignedCurve(counts),
		DeviceUnusedFallbackKeyTypes: unused,
		AccountData:                  accountData,
	}, nil
}

// SetMembership records that a user (local or remote) joined or left a
// room. Membership is fed by an administrator or a homeserver until rooms
// are ours; the device-list logic only reads it.
func (s *Service) SetMembership(ctx context.Context, roomID, userID, membership string) error {
	if !strings.HasPrefix(roomID, "!") || !strings.Contains(roomID, ":") || len(roomID) > 255 {
		return mxerr.InvalidParam("%q is not a valid room ID", roomID)
	}
	if _, ok := ParseUserID(userID); !ok {
		return mxerr.InvalidParam("%q is not a valid user ID", userID)
	}
	if membership != storage.MembershipJoin && membership != storage.MembershipLeave {
		return mxerr.InvalidParam("membership must be %q or %q", storage.MembershipJoin, storage.MembershipLeave)
	}
	res, err := s.db.SetMembership(ctx, roomID, userID, membership, s.nowMS())
	if err != nil {
		return err
	}
	s.membershipChanged(res.Change, res.NewlyStale)
	return nil
}

// RoomWritten follows a committed write of room events (package
// roomserver): membership events in it changed who shares a room with
// whom in the same transaction. The waiting /sync requests of the local
// users concerned wake, newly tracked remote lists are fetched, and the
// events queued for other servers are sent.
func (s *Service) RoomWritten(res storage.RoomWriteResult) {
	s.membershipChanged(res.Change, res.NewlyStale)
	if res.PDUsQueued && s.sender != nil {
		s.sender.Poke()
	}
}

func (s *Service) membershipChanged(ch storage.Change, newlyStale []storage.StaleUser) {
	s.streamAdvanced(ch)
	if len(newlyStale) > 0 && s.updater != nil {
		s.updater.Wake()
	}
}
